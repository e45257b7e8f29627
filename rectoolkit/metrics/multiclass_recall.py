"""Multiclass recall at k (`torchrec.metrics.multiclass_recall.MulticlassRecallMetric`): for k = 1 ..
number_of_classes, the weighted share of samples whose label class is among the k classes of highest prediction,
lifetime and window. Predictions are [batch, number_of_classes] scores per task, labels the class indices.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = MulticlassRecallMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")],
    ...                                 number_of_classes=3)
    >>> metric.update(predictions={"t": torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.1, 0.4]])},
    ...               labels={"t": torch.tensor([0.0, 2.0])}, weights=None)
    >>> metric.compute()["multiclass_recall-t|lifetime_multiclass_recall"].tolist()   # top-1, top-2, top-3
    [[0.5, 1.0, 1.0]]
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Tuple

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_config import RecComputeMode
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException
from rectoolkit.metrics.sum_states import SumStatesComputation

logger = logging.getLogger(__name__)

TP_AT_K = "tp_at_k"
TOTAL_WEIGHTS = "total_weights"


def compute_true_positives_at_k(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                                n_classes: int) -> torch.Tensor:
    """`torchrec.metrics.multiclass_recall.compute_true_positives_at_k`: for k < n_classes, the weight of the
    samples whose label is among their k+1 top predictions ([n, C] -> [n_classes], [T, n, C] -> [T, n_classes];
    float32, as TorchRec's)."""
    ranking = torch.argsort(predictions, dim=-1, descending=True)[..., :n_classes]
    # the weight of each sample at the rank of its label's class, then accumulated over k
    at_rank = (ranking == labels.unsqueeze(-1)) * weights.unsqueeze(-1)
    return torch.cumsum(at_rank.sum(dim=-2), dim=-1).float()


def compute_multiclass_recall_at_k(tp_at_k: torch.Tensor, total_weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.multiclass_recall.compute_multiclass_recall_at_k`: recall at each k."""
    return tp_at_k / torch.unsqueeze(total_weights, dim=-1)


def get_multiclass_recall_states(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                                 n_classes: int) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.multiclass_recall.get_multiclass_recall_states` (predictions first, as TorchRec's)."""
    return {TP_AT_K: compute_true_positives_at_k(predictions, labels, weights, n_classes),
            TOTAL_WEIGHTS: torch.sum(weights, dim=-1)}


class MulticlassRecallMetricComputation(SumStatesComputation):
    """TorchRec's states: `tp_at_k` ([n_tasks, number_of_classes]: the weight of the samples whose label is in the
    top k+1 predictions) and `total_weights` ([n_tasks])."""

    _state_names = (TP_AT_K, TOTAL_WEIGHTS)

    def __init__(self, *args: Any, number_of_classes: int, **kwargs: Any) -> None:
        if isinstance(number_of_classes, bool) or not isinstance(number_of_classes, int) or number_of_classes < 1:
            raise ValueError(f"MulticlassRecallMetric: number_of_classes={number_of_classes!r} must be a positive int "
                             "(the width of each prediction row)")
        self._n_classes = number_of_classes
        super().__init__(*args, **kwargs)

    def _state_shape(self, name: str) -> Tuple[int, ...]:
        return (self._n_classes,) if name == TP_AT_K else ()

    def _num_samples(self, predictions: torch.Tensor, labels: torch.Tensor) -> int:
        return predictions.shape[-2]

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        if predictions.dim() != 3 or predictions.shape[-1] != self._n_classes:
            raise RecMetricException(f"MulticlassRecallMetric: predictions have shape {tuple(predictions.shape[1:])} "
                                     f"per task; expected [batch, number_of_classes={self._n_classes}]")
        if weights.dim() == predictions.dim():  # the default weights (RecMetric makes them like the predictions)
            weights = weights[..., 0]
        return get_multiclass_recall_states(predictions, labels, weights, self._n_classes)

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.MULTICLASS_RECALL, prefix, compute_multiclass_recall_at_k(hits, total))
                for (prefix, hits), (_, total) in zip(self._lifetime_and_window(TP_AT_K),
                                                      self._lifetime_and_window(TOTAL_WEIGHTS))]


class MulticlassRecallMetric(RecMetric):
    """`multiclass_recall-{task}|{lifetime,window}_multiclass_recall`, a [number_of_classes] tensor per task (recall
    at k = 1 .., number_of_classes); TorchRec's constructor with its required `number_of_classes`."""

    _namespace = MetricNamespace.MULTICLASS_RECALL
    _computation_class = MulticlassRecallMetricComputation

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._compute_mode == RecComputeMode.FUSED_TASKS_AND_STATES_COMPUTATION:
            logger.warning(f"compute_mode FUSED_TASKS_AND_STATES_COMPUTATION can't support {self._namespace} yet "
                           "because its states are not 1D Tensors. Only FUSED_TASKS_COMPUTATION will take effect.")


__all__ = ["MulticlassRecallMetric", "MulticlassRecallMetricComputation", "compute_multiclass_recall_at_k",
           "compute_true_positives_at_k", "get_multiclass_recall_states"]
