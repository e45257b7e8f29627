"""The weighted sum of the predictions (`torchrec.metrics.weighted_sum_predictions.WeightedSumPredictionsMetric`): sum of w * p per task (a nan prediction counts 0), lifetime and window, summed over
the ranks.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = WeightedSumPredictionsMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.25])},
    ...               labels={"t": torch.tensor([1.0, 1.0, float("nan")])}, weights={"t": torch.tensor([2.0, 0.5, 9.0])})
    >>> float(metric.compute()["weighted_sum_predictions-t|lifetime_weighted_sum_predictions"])
    3.5
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.sum_states import SingleSumComputation, single_sum_states


def compute_weighted_predictions_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.weighted_sum_predictions.compute_weighted_predictions_sum`:
    the weighted predictions summed over the last dim (a nan prediction counts 0)."""
    return torch.sum(weights * torch.nan_to_num(predictions, 0), dim=-1)


def get_weighted_sum_prediction_states(labels: torch.Tensor, predictions: torch.Tensor,
                                       weights: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.weighted_sum_predictions.get_weighted_sum_prediction_states`:
    {"weighted_predictions_sum": ...} of a batch (weights None: all ones)."""
    return single_sum_states("weighted_predictions_sum", compute_weighted_predictions_sum, labels, predictions, weights)


class WeightedSumPredictionsMetricComputation(SingleSumComputation):
    """TorchRec's computation: the state `weighted_predictions_sum` ([n_tasks] float64)."""

    _state_name = "weighted_predictions_sum"
    _metric_name = MetricName.WEIGHTED_SUM_PREDICTIONS

    def _batch_sum(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return compute_weighted_predictions_sum(labels, predictions, weights)


class WeightedSumPredictionsMetric(RecMetric):
    """`weighted_sum_predictions-{task}|{lifetime,window}_weighted_sum_predictions` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.WEIGHTED_SUM_PREDICTIONS
    _computation_class = WeightedSumPredictionsMetricComputation


__all__ = ["compute_weighted_predictions_sum", "get_weighted_sum_prediction_states", "WeightedSumPredictionsMetric", "WeightedSumPredictionsMetricComputation"]
