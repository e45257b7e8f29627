"""Normalized entropy (`torchrec.metrics.ne.NEMetric`): the weighted cross-entropy of the predictions divided
by the entropy of always predicting the mean label, log base 2; below 1 means better than the base rate.

    NE = sum_i w_i CE(y_i, p_i) / (P CE(1, ctr) + N CE(0, ctr)),  ctr = P / (P + N), P = sum w y, N = sum w (1-y)

Predictions and ctr are clamped to [1e-12, 1 - 1e-12]. `include_logloss=True` adds `logloss` (the weighted
mean cross-entropy).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> ne = NEMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")], window_size=4)
    >>> ne.update(predictions={"t": torch.full((4,), 0.5)}, labels={"t": torch.tensor([1., 0., 1., 0.])},
    ...           weights=None)
    >>> float(ne.compute()["ne-t|lifetime_ne"])   # predicting the base rate: NE = 1
    1.0
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import SumStateMetric
from rectoolkit.metrics.sum_states import OneValueComputation

ETA = 1e-12


def cross_entropy_bits(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                       eta: float = ETA) -> torch.Tensor:
    """Per-sample weighted binary cross-entropy in bits, predictions clamped to [eta, 1 - eta]."""
    p = predictions.double().clamp(eta, 1 - eta)
    return -weights * (labels * torch.log2(p) + (1 - labels) * torch.log2(1 - p))


def normalized_entropy(cross_entropy_sum: torch.Tensor, weighted_num_samples: torch.Tensor,
                       positives: torch.Tensor, negatives: torch.Tensor, eta: float = ETA) -> torch.Tensor:
    """NE from the four sums (see the module docstring)."""
    ctr = (positives / weighted_num_samples.clamp(min=eta)).double().clamp(eta, 1 - eta)
    return cross_entropy_sum / (-positives * torch.log2(ctr) - negatives * torch.log2(1 - ctr))


def compute_cross_entropy(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                          eta: float) -> torch.Tensor:
    """`torchrec.metrics.ne.compute_cross_entropy`: per-sample weighted cross-entropy in bits (float64)."""
    return cross_entropy_bits(labels, predictions, weights, eta)


def compute_ne(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
               neg_labels: torch.Tensor, eta: float, allow_missing_label_with_zero_weight: bool = False) -> torch.Tensor:
    """`torchrec.metrics.ne.compute_ne`: per-task NE from the four sums; with allow_missing_label_with_zero_weight
    a task without weight gets eta."""
    ne = normalized_entropy(ce_sum, weighted_num_samples.double(), pos_labels, neg_labels, eta)
    if allow_missing_label_with_zero_weight and not weighted_num_samples.all():
        return torch.where(weighted_num_samples > 0, ne, eta)
    return ne


def compute_logloss(ce_sum: torch.Tensor, pos_labels: torch.Tensor, neg_labels: torch.Tensor,
                    eta: float) -> torch.Tensor:
    """`torchrec.metrics.ne.compute_logloss`: the weighted mean cross-entropy per task."""
    return ce_sum / (pos_labels + neg_labels).clamp(min=eta)


def get_ne_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                  eta: float) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.ne.get_ne_states`: a batch's four sums over the last dim ([n_tasks, batch] -> [n_tasks])."""
    return {
        "cross_entropy_sum": torch.sum(cross_entropy_bits(labels, predictions, weights, eta), dim=-1),
        "weighted_num_samples": torch.sum(weights, dim=-1),
        "pos_labels": torch.sum(weights * labels, dim=-1),
        "neg_labels": torch.sum(weights * (1.0 - labels), dim=-1),
    }


NE_STATES = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")


def task_entropy(compute: Callable[..., torch.Tensor], states: torch.Tensor,
                 allow_missing_label_with_zero_weight: bool) -> torch.Tensor:
    """`compute(*states, ETA)` (a compute_* of the NE family) for one task's sums, whose second is the weight;
    with allow_missing_label_with_zero_weight, ETA in float64 while that weight is not positive, task by task (the
    TorchRec functions give `[eta]` in float32 for all tasks once one has no weight)."""
    if allow_missing_label_with_zero_weight and not states[1] > 0:
        return torch.tensor(ETA, dtype=torch.float64)
    return compute(*states, ETA)


class EntropyComputation(OneValueComputation):
    """The NE family's computations (NE, NE of the positives, calibration-free and unweighted NE): TorchRec's
    `allow_missing_label_with_zero_weight` and `self.eta` (1e-12), passed to `_get_states` and `_compute_value` after
    their sums; weights=None refused, as TorchRec's."""

    _weights_required = True

    def __init__(self, *args: Any, allow_missing_label_with_zero_weight: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._allow_missing_label_with_zero_weight = allow_missing_label_with_zero_weight
        self.eta = ETA

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return self._get_states(labels, predictions, weights, self.eta)

    def _compute(self) -> List[MetricComputationReport]:
        return self._lifetime_and_window_reports(self._metric_name, self._compute_value, self._state_names, self.eta,
                                                 self._allow_missing_label_with_zero_weight)


class NEMetricComputation(EntropyComputation):
    """TorchRec's NE computation: states `cross_entropy_sum`, `weighted_num_samples`, `pos_labels`, `neg_labels`
    ([n_tasks] float64, each with its window), reports `ne` (and `logloss` with include_logloss), lifetime then
    window.

        >>> computation = NEMetricComputation(my_rank=0, batch_size=2, n_tasks=1, window_size=4)
        >>> computation.update(predictions=torch.tensor([[0.5, 0.5]]), labels=torch.tensor([[1.0, 0.0]]),
        ...                    weights=torch.ones(1, 2))
        >>> [(str(report.metric_prefix), report.value.tolist()) for report in computation.compute()]
        [('lifetime_', [1.0]), ('window_', [1.0])]
    """

    _state_names = NE_STATES
    _metric_name = MetricName.NE
    _get_states = staticmethod(get_ne_states)
    _compute_value = staticmethod(compute_ne)

    def __init__(self, *args: Any, include_logloss: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._include_logloss = include_logloss

    def _compute(self) -> List[MetricComputationReport]:
        reports = super()._compute()
        if self._include_logloss:
            reports += self._lifetime_and_window_reports(MetricName.LOG_LOSS, compute_logloss,
                                                         ("cross_entropy_sum", "pos_labels", "neg_labels"), self.eta)
        return reports


class NEMetric(SumStateMetric):
    """Lifetime and window NE per task (keys `ne-{task}|lifetime_ne`, `ne-{task}|window_ne`).

    Options: include_logloss (also `*_logloss`), allow_missing_label_with_zero_weight (NE is 1e-12 instead of
    inf/nan while a task has no weight at all).
    """

    _namespace = "ne"
    _state_names = NE_STATES
    _options = {"include_logloss": False, "allow_missing_label_with_zero_weight": False}
    _report_groups = (("ne",), ("logloss",))

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_ne_states(labels, predictions, weights, ETA)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        cross_entropy_sum, _, positives, negatives = states
        values = {"ne": task_entropy(compute_ne, states, self._options["allow_missing_label_with_zero_weight"])}
        if self._options["include_logloss"]:
            values["logloss"] = compute_logloss(cross_entropy_sum, positives, negatives, ETA)
        return values


__all__ = ["NE_STATES", "EntropyComputation", "NEMetric", "NEMetricComputation", "compute_cross_entropy", "compute_logloss", "compute_ne", "cross_entropy_bits", "get_ne_states",
           "normalized_entropy", "task_entropy"]
