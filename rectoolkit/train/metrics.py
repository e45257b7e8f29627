"""Training metrics: binary cross-entropy, AUC (rank formula, ties averaged), throughput. The metrics of a
job across ranks (NE, calibration, windows) are `rectoolkit.metrics`.

    >>> auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
    0.75
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.nn.functional as F

from rectoolkit.metrics.auc import weighted_auc


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: P(a random positive scores above a random negative), ties count 1/2.

    Labels above 1/2 are positives. The rank formula of `rectoolkit.metrics.auc.weighted_auc` with unit weights;
    NaN (not 0.5) when a class is missing.
    """
    scores = scores.detach().flatten().cpu()
    labels = (labels.detach().flatten().cpu() > 0.5).double()
    if scores.numel() != labels.numel():
        raise ValueError(f"auc: {scores.numel()} scores but {labels.numel()} labels")
    positives = int(labels.sum())
    if positives == 0 or positives == labels.numel():
        return float("nan")
    return float(weighted_auc(scores, labels, torch.ones_like(labels)))


def log_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean binary cross-entropy of logits against 0/1 labels."""
    return float(F.binary_cross_entropy_with_logits(logits.detach().flatten().float(), labels.flatten().float()))


class Throughput:
    """Samples per second since the last `rate()` call (the first call measures from construction)."""

    def __init__(self) -> None:
        self._since = time.perf_counter()
        self._samples = 0

    def add(self, samples: int) -> None:
        self._samples += samples

    def rate(self, now: Optional[float] = None) -> float:
        now = time.perf_counter() if now is None else now
        elapsed = max(now - self._since, 1e-9)
        rate = self._samples / elapsed
        self._since, self._samples = now, 0
        return rate
