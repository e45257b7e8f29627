"""The weighted number of missing labels (`torchrec.metrics.num_missing_labels.NumMissingLabelsMetric`): sum of w over the samples whose label is nan, per task, lifetime and window, summed over
the ranks.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = NumMissingLabelsMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.25])},
    ...               labels={"t": torch.tensor([1.0, 1.0, float("nan")])}, weights={"t": torch.tensor([2.0, 0.5, 9.0])})
    >>> float(metric.compute()["num_missing_labels-t|lifetime_num_missing_labels"])
    9.0
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.sum_states import SingleSumComputation, single_sum_states


def compute_missing_label_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.num_missing_labels.compute_missing_label_sum`:
    the weight of the nan labels summed over the last dim."""
    return torch.sum(torch.where(torch.isnan(labels), weights, 0), dim=-1)


def get_num_missing_labels_states(labels: torch.Tensor, predictions: torch.Tensor,
                                  weights: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.num_missing_labels.get_num_missing_labels_states`:
    {"missing_label_sum": ...} of a batch (weights None: all ones)."""
    return single_sum_states("missing_label_sum", compute_missing_label_sum, labels, predictions, weights)


class NumMissingLabelsMetricComputation(SingleSumComputation):
    """TorchRec's computation: the state `missing_label_sum` ([n_tasks] float64)."""

    _state_name = "missing_label_sum"
    _metric_name = MetricName.NUM_MISSING_LABELS

    def _batch_sum(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return compute_missing_label_sum(labels, predictions, weights)


class NumMissingLabelsMetric(RecMetric):
    """`num_missing_labels-{task}|{lifetime,window}_num_missing_labels` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.NUM_MISSING_LABELS
    _computation_class = NumMissingLabelsMetricComputation


__all__ = ["compute_missing_label_sum", "get_num_missing_labels_states", "NumMissingLabelsMetric", "NumMissingLabelsMetricComputation"]
