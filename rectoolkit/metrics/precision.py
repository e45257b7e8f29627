"""Precision (`torchrec.metrics.precision.PrecisionMetric`): of the weight predicted positive
(`prediction >= threshold`), the share that is labelled positive, TP / (TP + FP) with TP = sum w y and
FP = sum w (1 - y) over the predicted positives (0 while nothing is predicted positive).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = PrecisionMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.9, 0.5, 0.7, 0.1])},
    ...               labels={"t": torch.tensor([1., 1., 0., 0.])}, weights=None)
    >>> round(float(metric.compute()["precision-t|lifetime_precision"]), 4)   # 2 of the 3 predicted positives
    0.6667
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from rectoolkit.metrics.rec_metric import ratio_or_zero
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.thresholded import ThresholdedComputation, ThresholdedMetric, thresholded_states


def compute_precision(num_true_positives: torch.Tensor, num_false_positives: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.precision.compute_precision`: per-task precision (float64), 0 with no predicted positive."""
    return ratio_or_zero(num_true_positives, (num_true_positives + num_false_positives).double())


def compute_true_pos_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                         threshold: float = 0.5) -> torch.Tensor:
    """`torchrec.metrics.precision.compute_true_pos_sum`: weight of predictions >= threshold on positive labels."""
    return torch.sum(weights * ((predictions.double() >= threshold) * labels), dim=-1)


def compute_false_pos_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                          threshold: float = 0.5) -> torch.Tensor:
    """`torchrec.metrics.precision.compute_false_pos_sum`: weight of predictions >= threshold on negative labels."""
    return torch.sum(weights * ((predictions.double() >= threshold) * (1 - labels)), dim=-1)


def get_precision_states(labels: torch.Tensor, predictions: torch.Tensor, weights: Optional[torch.Tensor],
                         threshold: float = 0.5) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.precision.get_precision_states`: a batch's sums (weights None: all ones)."""
    return thresholded_states(labels, predictions, weights, threshold,
                              {"true_pos_sum": compute_true_pos_sum, "false_pos_sum": compute_false_pos_sum})


class PrecisionMetricComputation(ThresholdedComputation):
    """TorchRec's precision computation: states `true_pos_sum`, `false_pos_sum` (float64, with windows), reports
    `precision`; `threshold` as TorchRec's (default 0.5)."""

    _state_names = ("true_pos_sum", "false_pos_sum")
    _metric_name = MetricName.PRECISION
    _get_states = staticmethod(get_precision_states)
    _compute_value = staticmethod(compute_precision)


class PrecisionMetric(ThresholdedMetric):
    """Lifetime and window precision per task (`precision-{task}|{lifetime,window}_precision`); `threshold` as
    TorchRec's (default 0.5)."""

    _namespace = "precision"
    _state_names = PrecisionMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_precision_states(labels, predictions, weights, self._threshold)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"precision": compute_precision(*states)}


__all__ = ["PrecisionMetricComputation", "PrecisionMetric", "compute_false_pos_sum", "compute_precision", "compute_true_pos_sum", "get_precision_states"]
