"""The weighted number of positive samples (`torchrec.metrics.num_positive_samples.NumPositiveSamplesMetric`): sum of w * y per task (a missing label, nan, counts 0), lifetime and window, summed over
the ranks.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = NumPositiveSamplesMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.25])},
    ...               labels={"t": torch.tensor([1.0, 1.0, float("nan")])}, weights={"t": torch.tensor([2.0, 0.5, 9.0])})
    >>> float(metric.compute()["num_positive_samples-t|lifetime_num_positive_samples"])
    2.5
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.sum_states import SingleSumComputation, single_sum_states


def compute_weighted_pos_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.num_positive_samples.compute_weighted_pos_sum`:
    the weighted labels summed over the last dim (a nan label counts 0)."""
    return torch.sum(weights * torch.nan_to_num(labels, 0), dim=-1)


def get_num_positive_sample_states(labels: torch.Tensor, predictions: torch.Tensor,
                                   weights: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.num_positive_samples.get_num_positive_sample_states`:
    {"weighted_pos_sum": ...} of a batch (weights None: all ones)."""
    return single_sum_states("weighted_pos_sum", compute_weighted_pos_sum, labels, predictions, weights)


class NumPositiveSamplesMetricComputation(SingleSumComputation):
    """TorchRec's computation: the state `weighted_pos_sum` ([n_tasks] float64)."""

    _state_name = "weighted_pos_sum"
    _metric_name = MetricName.NUM_POSITIVE_SAMPLES

    def _batch_sum(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return compute_weighted_pos_sum(labels, predictions, weights)


class NumPositiveSamplesMetric(RecMetric):
    """`num_positive_samples-{task}|{lifetime,window}_num_positive_samples` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.NUM_POSITIVE_SAMPLES
    _computation_class = NumPositiveSamplesMetricComputation


__all__ = ["compute_weighted_pos_sum", "get_num_positive_sample_states", "NumPositiveSamplesMetric", "NumPositiveSamplesMetricComputation"]
