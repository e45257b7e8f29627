"""NE over serving data (`torchrec.metrics.serving_ne.ServingNEMetric`): lifetime and window NE (see ne.py), and
`total_examples`, the lifetime count of samples with a nonzero weight (the served ones), as a long tensor.

Written as TorchRec's metric is, a RecMetricComputation (see computation.py), so its keys, dtypes and state_dict
(`num_examples` beside NE's four sums, no window of it) are TorchRec's. `ServingMetricComputation` is shared with
serving_calibration.py.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = ServingNEMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.9])}, labels={"t": torch.tensor([0., 1., 1.])},
    ...               weights={"t": torch.tensor([1., 1., 0.])})
    >>> {key: value.tolist() for key, value in metric.compute().items()}
    {'serving_ne-t|lifetime_ne': [1.0], 'serving_ne-t|window_ne': [1.0], 'serving_ne-t|total_examples': [2]}
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.ne import cross_entropy_bits, normalized_entropy
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException

NUM_EXAMPLES = "num_examples"


def checked_batch(metric: str, predictions: Optional[torch.Tensor], labels: torch.Tensor,
                  weights: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A computation's [n_tasks, batch] inputs in float64, refused by name when missing or of other shapes."""
    if predictions is None or weights is None:
        raise RecMetricException(f"Inputs 'predictions' and 'weights' should not be None for {metric} update")
    if not predictions.shape == labels.shape == weights.shape:
        raise ValueError(f"{metric}.update: predictions {tuple(predictions.shape)}, labels {tuple(labels.shape)} "
                         f"and weights {tuple(weights.shape)} must have one shape (one value per sample)")
    return predictions.double(), labels.double(), weights.double()


class ServingMetricComputation(RecMetricComputation):
    """Windowed float64 sums (`_sum_states`, from `_batch_sums`) and the lifetime count of samples with a nonzero
    weight (`num_examples`, long, reported as `total_examples`); a subclass adds `_values` of the sums."""

    _sum_states: Tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._allow_missing_label_with_zero_weight:
            raise ValueError(f"{type(self).__name__}: allow_missing_label_with_zero_weight=True is not supported: "
                             "TorchRec 1.8's serving metrics ignore it; leave it False")
        for name in self._sum_states:
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="sum", persistent=True)
        self._add_state(NUM_EXAMPLES, torch.zeros(self._n_tasks, dtype=torch.long), add_window_state=False,
                        dist_reduce_fx="sum", persistent=True)

    def _batch_sums(self, predictions: torch.Tensor, labels: torch.Tensor,
                    weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    def _values(self, sums: Dict[str, torch.Tensor]) -> Tuple[MetricName, torch.Tensor]:
        """(name, [n_tasks] value) from the lifetime or window sums."""
        raise NotImplementedError

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        predictions, labels, weights = checked_batch(type(self).__name__, predictions, labels, weights)
        for name, value in self._batch_sums(predictions, labels, weights).items():
            getattr(self, name).add_(value)
            self._aggregate_window_state(name, value, labels.shape[-1])
        self.num_examples.add_(torch.count_nonzero(weights, dim=-1))

    def _compute(self) -> List[MetricComputationReport]:
        lifetime_name, lifetime = self._values({name: getattr(self, name) for name in self._sum_states})
        window_name, window = self._values({name: self.get_window_state(name) for name in self._sum_states})
        return [MetricComputationReport(lifetime_name, MetricPrefix.LIFETIME, lifetime),
                MetricComputationReport(window_name, MetricPrefix.WINDOW, window),
                MetricComputationReport(MetricName.TOTAL_EXAMPLES, MetricPrefix.DEFAULT, self.num_examples.clone())]


class ServingNEMetricComputation(ServingMetricComputation):
    """NE's four sums per task, and the served-sample count."""

    _sum_states = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")

    def _batch_sums(self, predictions: torch.Tensor, labels: torch.Tensor,
                    weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"cross_entropy_sum": cross_entropy_bits(labels, predictions, weights).sum(-1),
                "weighted_num_samples": weights.sum(-1), "pos_labels": (weights * labels).sum(-1),
                "neg_labels": (weights * (1 - labels)).sum(-1)}

    def _values(self, sums: Dict[str, torch.Tensor]) -> Tuple[MetricName, torch.Tensor]:
        return MetricName.NE, normalized_entropy(*(sums[name] for name in self._sum_states))


class ServingNEMetric(RecMetric):
    """Lifetime and window NE and the served-sample count per task (`serving_ne-{task}|{lifetime,window}_ne`,
    `serving_ne-{task}|total_examples`)."""

    _namespace = "serving_ne"
    _computation_class = ServingNEMetricComputation


__all__ = ["ServingMetricComputation", "ServingNEMetric", "ServingNEMetricComputation", "checked_batch"]
