"""NE of the positives (`torchrec.metrics.ne_positive.NEPositiveMetric`): NE's normalization with only the
positive labels' cross-entropy on top, sum_i w_i y_i (-log2 p_i) / (P CE(1, ctr) + N CE(0, ctr)); see ne.py.
Predictions and ctr are clamped to [1e-12, 1 - 1e-12], as in NE.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = NEPositiveMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.9])}, labels={"t": torch.tensor([1., 0.])},
    ...               weights=None)
    >>> float(metric.compute()["ne_positive-t|lifetime_ne_positive"])   # 1 bit over the base rate's 2 bits
    0.5
"""

from __future__ import annotations

from typing import Dict

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.ne import ETA, EntropyComputation, get_ne_states, normalized_entropy, task_entropy
from rectoolkit.metrics.rec_metric import SumStateMetric


def compute_cross_entropy_positive(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                                   eta: float) -> torch.Tensor:
    """`torchrec.metrics.ne_positive.compute_cross_entropy_positive`: the positives' weighted cross-entropy in bits
    (float64), predictions clamped to [eta, 1 - eta]."""
    return -weights * labels * torch.log2(predictions.double().clamp(eta, 1 - eta))


def compute_ne_positive(ce_positive_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
                        neg_labels: torch.Tensor, eta: float,
                        allow_missing_label_with_zero_weight: bool = False) -> torch.Tensor:
    """`torchrec.metrics.ne_positive.compute_ne_positive`; with allow_missing_label_with_zero_weight and a task
    without weight, TorchRec's `torch.tensor([eta])` (one float32 value for all tasks)."""
    if allow_missing_label_with_zero_weight and not weighted_num_samples.all():
        return torch.tensor([eta])
    return normalized_entropy(ce_positive_sum, weighted_num_samples.double(), pos_labels, neg_labels, eta)


def get_ne_positive_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                           eta: float) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.ne_positive.get_ne_positive_states`: a batch's sums over the last dim."""
    states = get_ne_states(labels, predictions, weights, eta)
    del states["cross_entropy_sum"]
    return {"cross_entropy_positive_sum": torch.sum(compute_cross_entropy_positive(labels, predictions, weights, eta),
                                                    dim=-1), **states}


class NEPositiveMetricComputation(EntropyComputation):
    """TorchRec's computation: states `cross_entropy_positive_sum`, `weighted_num_samples`, `pos_labels`,
    `neg_labels` (float64, with windows), reports `ne_positive`."""

    _state_names = ("cross_entropy_positive_sum", "weighted_num_samples", "pos_labels", "neg_labels")
    _metric_name = MetricName.NE_POSITIVE
    _get_states = staticmethod(get_ne_positive_states)
    _compute_value = staticmethod(compute_ne_positive)


class NEPositiveMetric(SumStateMetric):
    """Lifetime and window NE of the positives per task (`ne_positive-{task}|{lifetime,window}_ne_positive`).

    Option: allow_missing_label_with_zero_weight (1e-12 instead of inf/nan while a task has no weight; per task
    here, where TorchRec's fused modes give 1e-12 to the first task only once any task has no weight).
    """

    _namespace = "ne_positive"
    _state_names = NEPositiveMetricComputation._state_names
    _options = {"allow_missing_label_with_zero_weight": False}

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_ne_positive_states(labels, predictions, weights, ETA)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"ne_positive": task_entropy(compute_ne_positive, states, self._options["allow_missing_label_with_zero_weight"])}


__all__ = ["NEPositiveMetric", "NEPositiveMetricComputation", "compute_cross_entropy_positive", "compute_ne_positive", "get_ne_positive_states"]
