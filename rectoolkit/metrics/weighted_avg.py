"""Weighted average of the predictions (`torchrec.metrics.weighted_avg.WeightedAvgMetric`): sum(w * p) / sum(w)
per task, for a model output that is a quantity rather than a probability. As in TorchRec there is no guard:
the value is nan while a task has no weight.

The window differs from the other metrics' as TorchRec's does: TorchRec counts an update as `labels.shape[0]`
samples, the rows of its [tasks, batch] input, so the window holds the last `window_size` updates (one task per
computation, unfused) or `window_size / n_tasks` updates (fused), whatever the batch size.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = WeightedAvgMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([2., 6.])}, labels={"t": torch.zeros(2)},
    ...               weights={"t": torch.tensor([3., 1.])})
    >>> float(metric.compute()["weighted_avg-t|lifetime_weighted_avg"])   # (3 * 2 + 1 * 6) / 4
    3.0
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_config import RecComputeMode
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import SumStateMetric
from rectoolkit.metrics.sum_states import SumStatesComputation


def get_mean(value_sum: torch.Tensor, num_samples: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.weighted_avg.get_mean`: value_sum / num_samples, no guard (nan / inf where num_samples is
    0, as TorchRec's)."""
    return value_sum / num_samples


def weighted_avg_states(predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """A batch's sums over the last dim (TorchRec's computation's update)."""
    return {"weighted_sum": (predictions * weights).sum(dim=-1), "weighted_num_samples": weights.sum(dim=-1)}


class WeightedAvgMetricComputation(SumStatesComputation):
    """TorchRec's weighted average computation: states `weighted_sum`, `weighted_num_samples` (float64, with
    windows), reports `weighted_avg`; an update counts `labels.shape[0]` samples in the window, as TorchRec's."""

    _state_names = ("weighted_sum", "weighted_num_samples")
    _weights_required = True

    def _num_samples(self, predictions: torch.Tensor, labels: torch.Tensor) -> int:
        return labels.shape[0]

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return weighted_avg_states(predictions, weights)

    def _compute(self) -> List[MetricComputationReport]:
        return self._lifetime_and_window_reports(MetricName.WEIGHTED_AVG, get_mean, self._state_names)


class WeightedAvgMetric(SumStateMetric):
    """Lifetime and window weighted average per task (`weighted_avg-{task}|{lifetime,window}_weighted_avg`)."""

    _namespace = "weighted_avg"
    _state_names = WeightedAvgMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return weighted_avg_states(predictions, weights)

    def _window_samples(self, predictions: torch.Tensor) -> int:
        # TorchRec's labels.shape[0]: the rows of the computation's [tasks, batch] input
        return 1 if self._compute_mode == RecComputeMode.UNFUSED_TASKS_COMPUTATION else len(self._tasks)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"weighted_avg": get_mean(*states)}


__all__ = ["WeightedAvgMetric", "WeightedAvgMetricComputation", "get_mean", "weighted_avg_states"]
