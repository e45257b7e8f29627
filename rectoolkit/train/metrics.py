"""Training metrics: binary cross-entropy, AUC (rank formula, ties averaged), throughput.

    >>> auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
    0.75
"""

from __future__ import annotations

import time
from typing import Optional

import torch
import torch.nn.functional as F


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve: P(a random positive scores above a random negative), ties count 1/2.

    Computed with the Mann-Whitney rank formula in O(n log n): rank all scores (tied scores share their
    average rank), then AUC = (sum of positives' ranks - P (P + 1) / 2) / (P N). NaN when a class is missing.
    """
    scores = scores.detach().flatten().to(torch.float64).cpu()
    labels = labels.detach().flatten().cpu() > 0.5
    if scores.numel() != labels.numel():
        raise ValueError(f"auc: {scores.numel()} scores but {labels.numel()} labels")
    positives = int(labels.sum())
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    sorted_scores, order = torch.sort(scores)
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)  # 1-based rank of each tie group's last member
    average_rank = ends - (counts.to(torch.float64) - 1) / 2
    ranks = torch.empty_like(scores)
    ranks[order] = average_rank[inverse]
    positive_rank_sum = float(ranks[labels].sum())
    return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


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
