"""Accuracy (`torchrec.metrics.accuracy.AccuracyMetric`): the weighted share of samples whose decision
`prediction >= threshold` equals the label (0 while there is no weight). As in TorchRec the decision is compared
with the label itself, so a fractional label never counts as right.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = AccuracyMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")], threshold=0.6)
    >>> metric.update(predictions={"t": torch.tensor([0.9, 0.5, 0.7, 0.1])},
    ...               labels={"t": torch.tensor([1., 1., 0., 0.])}, weights=None)
    >>> float(metric.compute()["accuracy-t|lifetime_accuracy"])   # right on the 1st and the 4th
    0.5
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.rec_metric import ratio_or_zero
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.thresholded import ThresholdedComputation, ThresholdedMetric


def compute_accuracy(accuracy_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.accuracy.compute_accuracy`: per-task accuracy (float64), 0 where there is no weight."""
    return ratio_or_zero(accuracy_sum, weighted_num_samples)


def compute_accuracy_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                         threshold: float = 0.5) -> torch.Tensor:
    """`torchrec.metrics.accuracy.compute_accuracy_sum`: the weight of the right predictions over the last dim."""
    return torch.sum(weights * ((predictions.double() >= threshold) == labels), dim=-1)


def get_accuracy_states(labels: torch.Tensor, predictions: torch.Tensor, weights: Optional[torch.Tensor],
                        threshold: float = 0.5) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.accuracy.get_accuracy_states`: a batch's sums (weights None: all ones)."""
    if weights is None:
        weights = torch.ones_like(predictions)
    return {"accuracy_sum": compute_accuracy_sum(labels, predictions, weights, threshold),
            "weighted_num_samples": torch.sum(weights, dim=-1)}


class AccuracyMetricComputation(ThresholdedComputation):
    """TorchRec's accuracy computation: states `accuracy_sum`, `weighted_num_samples` (float64, with windows), reports
    `accuracy`; `threshold` as TorchRec's (default 0.5)."""

    _state_names = ("accuracy_sum", "weighted_num_samples")
    _metric_name = MetricName.ACCURACY
    _get_states = staticmethod(get_accuracy_states)
    _compute_value = staticmethod(compute_accuracy)


class AccuracyMetric(ThresholdedMetric):
    """Lifetime and window accuracy per task (`accuracy-{task}|{lifetime,window}_accuracy`); `threshold` as
    TorchRec's (default 0.5)."""

    _namespace = "accuracy"
    _state_names = AccuracyMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_accuracy_states(labels, predictions, weights, self._threshold)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"accuracy": compute_accuracy(*states)}


__all__ = ["AccuracyMetricComputation", "AccuracyMetric", "compute_accuracy", "compute_accuracy_sum", "get_accuracy_states"]
