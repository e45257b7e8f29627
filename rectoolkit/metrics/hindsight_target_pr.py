"""Hindsight target precision / recall (`torchrec.metrics.hindsight_target_pr.HindsightTargetPRMetric`): over 1000
thresholds t = linspace(0, 1, 1000), the weighted true positives (p >= t, y), false positives (p >= t, 1 - y) and
false negatives (p <= t, y); the first threshold whose precision reaches `target_precision` (default 0.5; the last
one when none does), with the precision and recall there, lifetime and window.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = HindsightTargetPRMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")],
    ...                                  target_precision=0.75)
    >>> metric.update(predictions={"t": torch.tensor([0.1, 0.4, 0.6, 0.9])},
    ...               labels={"t": torch.tensor([0.0, 0.0, 1.0, 1.0])}, weights=None)
    >>> values = metric.compute()
    >>> int(values["hindsight_target_pr-t|lifetime_hindsight_target_pr"])   # t = 400 / 999, the first above 0.4
    400
    >>> float(values["hindsight_target_pr-t|lifetime_hindsight_target_precision"])
    1.0

The threshold's index is reported as a float64 number (TorchRec reports `torch.Tensor(index)`, an uninitialized
tensor of `index` elements). TorchRec's states have no task dimension ([1000]), so its fused modes fail in
compute(); here the unfused mode keeps that layout (its state_dict loads in either library) and the fused modes
keep [n_tasks, 1000] states and report each task's values as the unfused mode does.
"""

from __future__ import annotations

import numbers
from typing import Any, Dict, List, Optional

import torch

from rectoolkit.metrics.computation import _FUSED, MetricComputationReport
from rectoolkit.metrics.metrics_config import RecComputeMode
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.precision import compute_precision
from rectoolkit.metrics.recall import compute_recall
from rectoolkit.metrics.sum_states import SumStatesComputation, safe_ratio

THRESHOLD_GRANULARITY = 1000
TRUE_POS_SUM, FALSE_POS_SUM, FALSE_NEG_SUM = "true_pos_sum", "false_pos_sum", "false_neg_sum"


def threshold_index(true_positives: torch.Tensor, false_positives: torch.Tensor, target_precision: float) -> torch.Tensor:
    """Per row of [..., 1000] sums, the first threshold index whose precision reaches the target (else the last)."""
    reaches = safe_ratio(true_positives, true_positives + false_positives) >= target_precision
    first = torch.argmax(reaches.int(), dim=-1)  # the first True; 0 when there is none
    return torch.where(reaches.any(dim=-1), first, THRESHOLD_GRANULARITY - 1)


def _threshold_sums(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """The three sums at each of the 1000 thresholds ([..., batch] -> [..., 1000])."""
    thresholds = torch.linspace(0, 1, steps=THRESHOLD_GRANULARITY)
    predictions = predictions.double().unsqueeze(-1)  # [n_tasks, batch, 1] against [1000]
    labels, weights = labels.unsqueeze(-1), weights.unsqueeze(-1)
    above, below = (predictions >= thresholds), (predictions <= thresholds)
    return {TRUE_POS_SUM: torch.sum(weights * (above * labels), dim=-2),
            FALSE_POS_SUM: torch.sum(weights * (above * (1 - labels)), dim=-2),
            FALSE_NEG_SUM: torch.sum(weights * (below * labels), dim=-2)}


def compute_threshold_idx(num_true_positives: torch.Tensor, num_false_positives: torch.Tensor,
                          target_precision: float) -> int:
    """`torchrec.metrics.hindsight_target_pr.compute_threshold_idx`: the first of the 1000 thresholds whose
    precision reaches target_precision, else the last."""
    return int(threshold_index(num_true_positives, num_false_positives, target_precision))


def _torchrec_sum(name: str, labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One task's sum at each threshold ([1000] float64), as TorchRec's loops give it."""
    return _threshold_sums(labels, predictions, weights)[name].reshape(THRESHOLD_GRANULARITY).double()


def compute_true_pos_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.hindsight_target_pr.compute_true_pos_sum`: [1000], predictions >= each threshold."""
    return _torchrec_sum(TRUE_POS_SUM, labels, predictions, weights)


def compute_false_pos_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.hindsight_target_pr.compute_false_pos_sum`: [1000]."""
    return _torchrec_sum(FALSE_POS_SUM, labels, predictions, weights)


def compute_false_neg_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.hindsight_target_pr.compute_false_neg_sum`: [1000], predictions <= each threshold."""
    return _torchrec_sum(FALSE_NEG_SUM, labels, predictions, weights)


def get_pr_states(labels: torch.Tensor, predictions: torch.Tensor,
                  weights: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.hindsight_target_pr.get_pr_states`: one task's three [1000] sums (weights None: ones)."""
    if weights is None:
        weights = torch.ones_like(predictions)
    return {name: _torchrec_sum(name, labels, predictions, weights)
            for name in (TRUE_POS_SUM, FALSE_POS_SUM, FALSE_NEG_SUM)}


class HindsightTargetPRMetricComputation(SumStatesComputation):
    """TorchRec's states `true_pos_sum`, `false_pos_sum`, `false_neg_sum` ([1000] unfused, [n_tasks, 1000] fused)."""

    _state_names = (TRUE_POS_SUM, FALSE_POS_SUM, FALSE_NEG_SUM)

    def __init__(self, *args: Any, target_precision: float = 0.5, **kwargs: Any) -> None:
        if isinstance(target_precision, bool) or not isinstance(target_precision, numbers.Real):
            raise TypeError(f"HindsightTargetPRMetric: target_precision={target_precision!r} is not a number; pass a "
                            "float in [0, 1]")
        self._target_precision = float(target_precision)
        self._has_task_rows = kwargs.get("compute_mode", RecComputeMode.UNFUSED_TASKS_COMPUTATION) in _FUSED
        super().__init__(*args, **kwargs)

    def _state_shape(self, name: str) -> tuple:
        return (THRESHOLD_GRANULARITY,)

    def _add_state(self, name: str, default: Any, add_window_state: bool, **kwargs: Any) -> None:
        if self._has_task_rows is False:  # TorchRec's layout: no task dimension
            default = default[0]
        super()._add_state(name, default, add_window_state, **kwargs)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        states = _threshold_sums(labels, predictions, weights)
        return {name: value if self._has_task_rows else value[0] for name, value in states.items()}

    def _compute(self) -> List[MetricComputationReport]:
        reports = []
        for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW):
            def state(name: str) -> torch.Tensor:
                return getattr(self, name) if prefix == MetricPrefix.LIFETIME else self.get_window_state(name)

            true_pos, false_pos, false_neg = state(TRUE_POS_SUM), state(FALSE_POS_SUM), state(FALSE_NEG_SUM)
            index = threshold_index(true_pos, false_pos, self._target_precision)

            def at_index(values: torch.Tensor) -> torch.Tensor:
                return values.gather(-1, index.unsqueeze(-1)).squeeze(-1)

            reports.append((prefix, [
                (MetricName.HINDSIGHT_TARGET_PR, index.double()),
                (MetricName.HINDSIGHT_TARGET_PRECISION, safe_ratio(at_index(true_pos), at_index(true_pos + false_pos))),
                (MetricName.HINDSIGHT_TARGET_RECALL, safe_ratio(at_index(true_pos), at_index(true_pos + false_neg)))]))
        # TorchRec's order: each value lifetime then window
        return [MetricComputationReport(name, prefix, values[position][1])
                for position, name in enumerate(name for name, _ in reports[0][1])
                for prefix, values in reports]


class HindsightTargetPRMetric(RecMetric):
    """`hindsight_target_pr-{task}|{lifetime,window}_hindsight_target_{pr,precision,recall}` per task (TorchRec's
    constructor and its `target_precision` keyword)."""

    _namespace = MetricNamespace.HINDSIGHT_TARGET_PR
    _computation_class = HindsightTargetPRMetricComputation


__all__ = ["HindsightTargetPRMetric", "HindsightTargetPRMetricComputation", "THRESHOLD_GRANULARITY", "compute_false_neg_sum",
           "compute_false_pos_sum", "compute_precision", "compute_recall", "compute_threshold_idx",
           "compute_true_pos_sum", "get_pr_states"]
