"""The sum of the sample weights (`torchrec.metrics.sum_weights.SumWeightsMetric`): sum of w per task, lifetime and window, summed over
the ranks.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = SumWeightsMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.25])},
    ...               labels={"t": torch.tensor([1.0, 1.0, float("nan")])}, weights={"t": torch.tensor([2.0, 0.5, 9.0])})
    >>> float(metric.compute()["sum_weights-t|lifetime_sum_weights"])
    11.5
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.sum_states import SingleSumComputation, single_sum_states


def compute_weighted_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.sum_weights.compute_weighted_sum`: the weights summed over the last dim."""
    return torch.sum(weights, dim=-1)


def get_weighted_sum_states(labels: torch.Tensor, predictions: torch.Tensor,
                            weights: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.sum_weights.get_weighted_sum_states`:
    {"weighted_sum": ...} of a batch (weights None: all ones)."""
    return single_sum_states("weighted_sum", compute_weighted_sum, labels, predictions, weights)


class SumWeightsMetricComputation(SingleSumComputation):
    """TorchRec's computation: the state `weighted_sum` ([n_tasks] float64)."""

    _state_name = "weighted_sum"
    _metric_name = MetricName.SUM_WEIGHTS

    def _batch_sum(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return compute_weighted_sum(labels, predictions, weights)


class SumWeightsMetric(RecMetric):
    """`sum_weights-{task}|{lifetime,window}_sum_weights` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.SUM_WEIGHTS
    _computation_class = SumWeightsMetricComputation


__all__ = ["compute_weighted_sum", "get_weighted_sum_states", "SumWeightsMetric", "SumWeightsMetricComputation"]
