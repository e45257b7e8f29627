"""Recall (`torchrec.metrics.recall.RecallMetric`): of the positive label weight, the share predicted positive,
TP / (TP + FN) with TP = sum w y over `prediction >= threshold` and FN = sum w y over `prediction <= threshold`
(0 while both are 0). As in TorchRec, a prediction exactly at the threshold counts in both TP and FN.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = RecallMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.9, 0.3, 0.7, 0.1])},
    ...               labels={"t": torch.tensor([1., 1., 0., 0.])}, weights=None)
    >>> float(metric.compute()["recall-t|lifetime_recall"])   # 1 of the 2 positives
    0.5
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.precision import compute_true_pos_sum
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.thresholded import ThresholdedComputation, ThresholdedMetric, thresholded_states


def compute_recall(num_true_positives: torch.Tensor, num_false_negitives: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.recall.compute_recall`: per-task recall, 0 with no positive label (the inputs' dtype, as
    TorchRec's; its argument keeps TorchRec's spelling)."""
    positives = num_true_positives + num_false_negitives
    return torch.where(positives == 0.0, 0.0, num_true_positives / positives)


def compute_false_neg_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                          threshold: float = 0.5) -> torch.Tensor:
    """`torchrec.metrics.recall.compute_false_neg_sum`: weight of predictions <= threshold on positive labels."""
    return torch.sum(weights * ((predictions.double() <= threshold) * labels), dim=-1)


def get_recall_states(labels: torch.Tensor, predictions: torch.Tensor, weights: Optional[torch.Tensor],
                      threshold: float = 0.5) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.recall.get_recall_states`: a batch's sums (weights None: all ones)."""
    return thresholded_states(labels, predictions, weights, threshold,
                              {"true_pos_sum": compute_true_pos_sum, "false_neg_sum": compute_false_neg_sum})


class RecallMetricComputation(ThresholdedComputation):
    """TorchRec's recall computation: states `true_pos_sum`, `false_neg_sum` (float64, with windows), reports
    `recall`; `threshold` as TorchRec's (default 0.5)."""

    _state_names = ("true_pos_sum", "false_neg_sum")
    _metric_name = MetricName.RECALL
    _get_states = staticmethod(get_recall_states)
    _compute_value = staticmethod(compute_recall)


class RecallMetric(ThresholdedMetric):
    """Lifetime and window recall per task (`recall-{task}|{lifetime,window}_recall`); `threshold` as TorchRec's
    (default 0.5)."""

    _namespace = "recall"
    _state_names = RecallMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_recall_states(labels, predictions, weights, self._threshold)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"recall": compute_recall(*states)}


__all__ = ["RecallMetricComputation", "RecallMetric", "compute_false_neg_sum", "compute_recall", "compute_true_pos_sum", "get_recall_states"]
