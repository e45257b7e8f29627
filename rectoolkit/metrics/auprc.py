"""AUPRC (`torchrec.metrics.auprc.AUPRCMetric`): the area under the precision-recall curve of the window's
samples, weighted, as TorchRec's step (Riemann) sum over the distinct predictions from the highest down:

    AUPRC = sum_k (recall_k - recall_{k-1}) * precision_k,   recall_0 = 0,

with precision_k = TP_k / (TP_k + FP_k) and recall_k = TP_k / TP over the samples predicted >= the k-th
highest prediction (TP = sum w y, FP = sum w (1 - y)); 0 while the window has no positive weight.

The window is AUC's (the last ceil(window_size / world_size) samples per rank, all-gathered by compute()).
The lifetime value is TorchRec's: each time the values are computed (compute() on a rank that reports, or
local_compute()), the window's AUPRC enters a running average weighted by the window's total weight; in the
fused modes that average is over all tasks together (one value for every task), unfused per task. As in
TorchRec, reset() empties the window but keeps that running average.

    >>> weighted_auprc(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1., 0., 1., 0.]), torch.ones(4))
    tensor(0.8333, dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from rectoolkit.metrics.auc import SampleWindowMetric, mean_over_groups, torchrec_value_dtype
from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_config import RecComputeMode
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetricException
from rectoolkit.metrics.sample_window_computation import SAMPLE_STATES, SampleWindowComputation


def weighted_auprc(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted AUPRC of one task's samples (0-d float64); samples with the same prediction form one step."""
    predictions, order = torch.sort(predictions.double().flatten(), descending=True)
    positive = (weights.double().flatten() * labels.double().flatten())[order]
    negative = weights.double().flatten()[order] - positive
    _, group = torch.unique_consecutive(predictions, return_inverse=True)
    steps = int(group.max()) + 1 if group.numel() else 0
    true_positives = torch.zeros(steps, dtype=torch.float64).index_add_(0, group, positive).cumsum(0)
    false_positives = torch.zeros(steps, dtype=torch.float64).index_add_(0, group, negative).cumsum(0)
    if not steps or not true_positives[-1] > 0:
        return torch.zeros((), dtype=torch.float64)
    recall = true_positives / true_positives[-1]
    predicted = true_positives + false_positives
    precision = torch.where(predicted > 0, true_positives / predicted.clamp(min=1e-300), 1.0)
    recall_before = torch.cat([torch.zeros(1, dtype=torch.float64), recall[:-1]])
    return ((recall - recall_before) * precision).sum()


def _task_auprc(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return weighted_auprc(predictions, labels, weights).to(torchrec_value_dtype(predictions, labels, weights))


def compute_auprc(n_tasks: int, predictions: torch.Tensor, labels: torch.Tensor,
                  weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.auprc.compute_auprc`: per-task AUPRC of [n_tasks, n] samples (tied predictions one step,
    as TorchRec's), in the dtype of weights * labels; 0 without a positive."""
    return torch.cat([_task_auprc(p, y, w).view(1) for p, y, w in zip(predictions, labels, weights)])


def compute_auprc_per_group(n_tasks: int, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                            grouping_keys: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.auprc.compute_auprc_per_group`: per task, the float32 mean of the AUPRCs of each grouping
    key's samples; a leading -1 key (TorchRec's padding) drops the first sample; 0.5 without any group."""
    if grouping_keys.numel() != 0 and grouping_keys[0] == -1:
        grouping_keys, predictions, labels, weights = (grouping_keys[1:], predictions[:, 1:], labels[:, 1:],
                                                       weights[:, 1:])
    return mean_over_groups(predictions, labels, weights, grouping_keys, _task_auprc)


def lifetime_auprc(weighted_auprc_sum: torch.Tensor, weight_sum: torch.Tensor) -> torch.Tensor:
    """TorchRec's lifetime AUPRC: the sum of the window values computed so far, each times its window's weight,
    over the sum of those weights (times the tasks they cover); 0.5 before any weight."""
    return torch.where(weight_sum > 0, weighted_auprc_sum / weight_sum, torch.tensor(0.5, dtype=torch.float64))


class AUPRCMetricComputation(SampleWindowComputation):
    """TorchRec's AUPRC computation: the window's samples as one [n_tasks, n] float32 tensor per state list (the
    zero placeholder sample stays in the window until the window cuts it, as TorchRec's), the window AUPRC by
    compute_auprc, and the lifetime AUPRC: the average of the window values computed so far, weighted by their
    window's weight (`_lifetime_weighted_auprc`, `_lifetime_weight`; reset() keeps them, as TorchRec's).
    grouped_auprc=True is refused (not implemented)."""

    _grouped_option = "grouped_auprc"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lifetime_weighted_auprc = torch.tensor(0.0, dtype=torch.float64)
        self._lifetime_weight = torch.tensor(0.0, dtype=torch.float64)

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        if predictions is None or weights is None:
            raise RecMetricException(f"{type(self).__name__}.update: predictions and weights must be tensors of the "
                                     "labels' shape, got None; pass weights=torch.ones_like(labels) for unweighted "
                                     "samples")
        window_start = max(self.predictions[0].size(-1) + predictions.size(-1) - self._window_size, 0)
        for name, batch in zip(SAMPLE_STATES, (predictions, labels, weights)):
            samples = getattr(self, name)
            samples[0] = torch.cat([samples[0][:, window_start:], batch.float()], dim=-1)

    def _compute(self) -> List[MetricComputationReport]:
        window = compute_auprc(self._n_tasks, self.predictions[0], self.labels[0], self.weights[0])
        window_weight = self.weights[0].sum()
        self._lifetime_weighted_auprc = self._lifetime_weighted_auprc + (window * window_weight).sum()
        self._lifetime_weight = self._lifetime_weight + window_weight * self._n_tasks
        lifetime = lifetime_auprc(self._lifetime_weighted_auprc, self._lifetime_weight)
        return [MetricComputationReport(MetricName.AUPRC, MetricPrefix.WINDOW, window),
                MetricComputationReport(MetricName.AUPRC, MetricPrefix.LIFETIME, lifetime.expand(self._n_tasks))]


class AUPRCMetric(SampleWindowMetric):
    """Window and lifetime AUPRC per task (`auprc-{task}|window_auprc`, `auprc-{task}|lifetime_auprc`, in this
    order as TorchRec's). `grouped_auprc=True` is not implemented."""

    _namespace = "auprc"
    _float32_values = frozenset({("window", "auprc")})  # computed in float64, reported in TorchRec's float32
    _options = {"grouped_auprc": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._options["grouped_auprc"]:
            raise NotImplementedError("AUPRCMetric: grouped_auprc=True is not implemented in rectoolkit; pass False")
        unfused = self._compute_mode == RecComputeMode.UNFUSED_TASKS_COMPUTATION
        # TorchRec's metric computations: one per task (unfused) or one for all tasks
        self._computations = [[i] for i in range(len(self._tasks))] if unfused else [list(range(len(self._tasks)))]
        # per computation: sum of window AUPRC x window weight, and sum of window weight x its tasks
        self._lifetime_sums = torch.zeros(len(self._computations), 2, dtype=torch.float64)
        self._reported: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _report(self, states: List[torch.Tensor], key_prefix: str = "") -> Dict[str, torch.Tensor]:
        """Computes the window values, folds them into the lifetime average, then reports both."""
        # TorchRec's lifetime averages the float32 window values it reports
        window = [weighted_auprc(*samples).float().double() for samples in states]
        for computation, rows in enumerate(self._computations):
            window_weight = sum(states[row][2].sum() for row in rows)
            self._lifetime_sums[computation] += torch.stack([sum(window[row] for row in rows) * window_weight,
                                                             window_weight * len(rows)])
            lifetime = lifetime_auprc(*self._lifetime_sums[computation])
            self._reported.update({row: (window[row], lifetime) for row in rows})
        return super()._report(states, key_prefix)

    def _task_values(self, states: List[torch.Tensor], task_index: int) -> Iterator[Tuple[str, str, torch.Tensor]]:
        window, lifetime = self._reported[task_index]
        yield "window", "auprc", window
        yield "lifetime", "auprc", lifetime


__all__ = ["AUPRCMetric", "AUPRCMetricComputation", "compute_auprc", "compute_auprc_per_group", "lifetime_auprc",
           "weighted_auprc"]
