"""Label and prediction averages (`torchrec.metrics.average.AverageMetric`): sum(w * y) / sum(w) and
sum(w * p) / sum(w) per task, lifetime and window (0 while there is no weight).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = AverageMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.2, 0.6])}, labels={"t": torch.tensor([1.0, 0.0])},
    ...               weights={"t": torch.tensor([3.0, 1.0])})
    >>> {key: round(float(value), 3) for key, value in metric.compute().items() if "lifetime" in key}
    {'average-t|lifetime_label_average': 0.75, 'average-t|lifetime_prediction_average': 0.3}
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.sum_states import SumStatesComputation, safe_ratio

LABEL_SUM = "label_sum"
PREDICTION_SUM = "prediction_sum"
WEIGHTED_NUM_SAMPLES = "weighted_num_samples"


def compute_average(weighted_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.average.compute_average`: weighted_sum / weighted_num_samples (float64), 0 where there is no
    weight."""
    return safe_ratio(weighted_sum, weighted_num_samples)


def get_average_states(labels: torch.Tensor, predictions: torch.Tensor,
                       weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.average.get_average_states`: a batch's label, prediction and weight sums over the last dim."""
    return {LABEL_SUM: torch.sum(labels * weights, dim=-1), PREDICTION_SUM: torch.sum(predictions * weights, dim=-1),
            WEIGHTED_NUM_SAMPLES: torch.sum(weights, dim=-1)}


class AverageMetricComputation(SumStatesComputation):
    """TorchRec's states: `label_sum`, `prediction_sum`, `weighted_num_samples`."""

    _state_names = (LABEL_SUM, PREDICTION_SUM, WEIGHTED_NUM_SAMPLES)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return get_average_states(labels, predictions, weights)

    def _compute(self) -> List[MetricComputationReport]:
        # TorchRec's order: the lifetime label and prediction averages, then the window's
        samples = dict(self._lifetime_and_window(WEIGHTED_NUM_SAMPLES))
        return [MetricComputationReport(name, prefix, compute_average(total, samples[prefix]))
                for prefix in samples
                for name, state in ((MetricName.LABEL_AVERAGE, LABEL_SUM), (MetricName.PREDICTION_AVERAGE, PREDICTION_SUM))
                for total in [dict(self._lifetime_and_window(state))[prefix]]]


class AverageMetric(RecMetric):
    """`average-{task}|{lifetime,window}_{label,prediction}_average` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.AVERAGE
    _computation_class = AverageMetricComputation


__all__ = ["AverageMetric", "AverageMetricComputation", "compute_average", "get_average_states"]
