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

from typing import Dict

import torch

from rectoolkit.metrics.thresholded import ThresholdedMetric


class PrecisionMetric(ThresholdedMetric):
    """Lifetime and window precision per task (`precision-{task}|{lifetime,window}_precision`); `threshold` as
    TorchRec's (default 0.5)."""

    _namespace = "precision"
    _state_names = ("true_pos_sum", "false_pos_sum")

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        positive = self._predicted_positive(predictions)
        return torch.stack([(weights * positive * labels).sum(), (weights * positive * (1 - labels)).sum()])

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        true_positives, false_positives = states
        predicted = true_positives + false_positives
        return {"precision": true_positives / predicted if predicted != 0 else torch.zeros((), dtype=torch.float64)}


__all__ = ["PrecisionMetric"]
