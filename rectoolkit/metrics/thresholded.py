"""The base of the metrics that turn a prediction into a decision, `prediction >= threshold` (accuracy,
precision, recall): the `threshold` argument (TorchRec's, default 0.5), refused outside [0, 1] where every
prediction would fall on one side.

    >>> from rectoolkit.metrics.accuracy import AccuracyMetric
    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> AccuracyMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")], threshold=1.5)
    Traceback (most recent call last):
    ...
    ValueError: AccuracyMetric: threshold=1.5 is outside [0, 1]; pass a probability cut-off such as 0.5
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, Dict, Optional

import torch

from rectoolkit.metrics.rec_metric import SumStateMetric
from rectoolkit.metrics.sum_states import OneValueComputation


def thresholded_states(labels: torch.Tensor, predictions: torch.Tensor, weights: Optional[torch.Tensor],
                       threshold: float, sums: Dict[str, Callable[..., torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """TorchRec's get_precision_states / get_recall_states: each named sum of the batch (weights None: all ones)."""
    if weights is None:
        weights = torch.ones_like(predictions)
    return {name: compute(labels, predictions, weights, threshold) for name, compute in sums.items()}


class ThresholdedMetric(SumStateMetric):
    """A sum-state metric with TorchRec's `threshold` argument (`self._threshold`)."""

    _options = {"threshold": 0.5}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        threshold = self._options["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
            raise TypeError(f"{type(self).__name__}: threshold={threshold!r} is not a number; pass a float in [0, 1]")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"{type(self).__name__}: threshold={threshold!r} is outside [0, 1]; pass a probability "
                             "cut-off such as 0.5")
        self._threshold = float(threshold)


class ThresholdedComputation(OneValueComputation):
    """TorchRec's accuracy / precision / recall computation: a OneValueComputation whose `_get_states` takes its
    `threshold` too (default 0.5, taken as given, as TorchRec's computations do)."""

    def __init__(self, *args: Any, threshold: float = 0.5, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._threshold = threshold

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return self._get_states(labels, predictions, weights, self._threshold)


__all__ = ["ThresholdedComputation", "ThresholdedMetric", "thresholded_states"]
