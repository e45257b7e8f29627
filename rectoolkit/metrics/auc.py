"""AUC (`torchrec.metrics.auc.AUCMetric`): the area under the ROC curve of the window's samples, weighted:
the weight of (positive, negative) pairs the positive scores above, over the weight of all pairs.

As in TorchRec there is only a window AUC (`auc-{task}|window_auc`; the default window of 10M samples is a
lifetime for most runs): each rank keeps its last ceil(window_size / world_size) samples, cutting the oldest
batch mid-way if needed, and compute() all-gathers them. AUC is 0.5 when the window lacks positives or
negatives. Tied predictions count each (positive, negative) pair 1/2 (TorchRec's trapezoids depend on the order
of tied samples; without ties both are the same number).

    >>> weighted_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0., 0., 1., 1.]), torch.ones(4))
    tensor(0.7500, dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Tuple

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetric, all_gather_columns
from rectoolkit.metrics.sample_window_computation import SampleWindowComputation


def weighted_auc(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted AUC of one task's samples (0-d float64), ties 1/2, 0.5 without both classes.

    Labels may be fractional: a sample then counts as a positive of weight w*y and a negative of w*(1-y).
    """
    predictions, order = torch.sort(predictions.double().flatten())
    positive = (weights.double().flatten() * labels.double().flatten())[order]
    negative = weights.double().flatten()[order] - positive
    _, group, _ = torch.unique_consecutive(predictions, return_inverse=True, return_counts=True)
    groups = int(group.max()) + 1 if group.numel() else 0
    positive_per_score = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, positive)
    negative_per_score = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, negative)
    negatives_below = torch.cumsum(negative_per_score, 0) - negative_per_score
    pairs = positive_per_score.sum() * negative_per_score.sum()
    if not pairs > 0:
        return torch.tensor(0.5, dtype=torch.float64)
    return (positive_per_score * (negatives_below + negative_per_score / 2)).sum() / pairs


def _concatenated(predictions: List[torch.Tensor], labels: List[torch.Tensor],
                  weights: List[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TorchRec's state lists as [n_tasks, n] tensors (several tensors concatenated along the samples)."""
    return (torch.cat(predictions, dim=-1), torch.cat(labels, dim=-1), torch.cat(weights, dim=-1))


def _task_auc(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
              apply_bin: bool = False) -> torch.Tensor:
    """One task's AUC in TorchRec's dtype (that of weights * labels; float32 when empty)."""
    if apply_bin:
        labels = torch.ge(labels, 0.039).to(labels.dtype)
    return weighted_auc(predictions, labels, weights).to(torchrec_value_dtype(predictions, labels, weights))


def torchrec_value_dtype(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.dtype:
    """The dtype of TorchRec's per-task AUC / AUPRC: that of weights * labels (float32 when there is no sample)."""
    return torch.result_type(weights, labels) if predictions.numel() else torch.float32


def compute_auc(n_tasks: int, predictions: List[torch.Tensor], labels: List[torch.Tensor],
                weights: List[torch.Tensor], apply_bin: bool = False) -> torch.Tensor:
    """`torchrec.metrics.auc.compute_auc`: per-task AUC of [n_tasks, n] samples (lists of such tensors are
    concatenated), 0.5 without both classes; apply_bin reads labels >= 0.039 as 1. Tied predictions count 1/2
    (TorchRec: by their sort order)."""
    predictions_t, labels_t, weights_t = _concatenated(predictions, labels, weights)
    return torch.cat([_task_auc(p, y, w, apply_bin).view(1) for p, y, w in zip(predictions_t, labels_t, weights_t)])


def compute_auc_per_group(n_tasks: int, predictions: List[torch.Tensor], labels: List[torch.Tensor],
                          weights: List[torch.Tensor], grouping_keys: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.auc.compute_auc_per_group`: per task, the mean (float32) of the AUCs of the samples of
    each grouping key ([n]; a leading -1, TorchRec's padding, is dropped); 0.5 without any group."""
    predictions_t, labels_t, weights_t = _concatenated(predictions, labels, weights)
    if grouping_keys.numel() != 0 and grouping_keys[0] == -1:
        grouping_keys = grouping_keys[1:]
    return mean_over_groups(predictions_t, labels_t, weights_t, grouping_keys, _task_auc)


def mean_over_groups(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     grouping_keys: torch.Tensor, task_value: Callable[..., torch.Tensor]) -> torch.Tensor:
    """TorchRec's per-group AUC / AUPRC: per task ([n_tasks, n] inputs), the float32 mean of task_value over the
    samples of each grouping key ([n]); 0.5 without any group."""
    groups = torch.unique(grouping_keys)
    values = []
    for p, y, w in zip(predictions, labels, weights):
        total = torch.zeros(1, dtype=torch.float32)
        for group in groups:
            mask = grouping_keys == group
            total += task_value(p[mask], y[mask], w[mask]).view(1)
        values.append(total / len(groups) if len(groups) > 0 else torch.tensor([0.5], dtype=torch.float32))
    return torch.cat(values)


class SampleWindowMetric(RecMetric):
    """A metric of the window's samples themselves (AUC, AUPRC): per task, the last ceil(window_size /
    world_size) (prediction, label, weight) samples of this rank, all-gathered by compute()."""

    def reset(self) -> None:
        if self._computation_class is not None:  # a subclass run by its computations, TorchRec's way
            return super().reset()
        # per task: the window's [3 (prediction, label, weight), n] batches, oldest first
        self._batches: List[List[torch.Tensor]] = [[] for _ in self._tasks]
        self._synced_states = None

    def _update_task(self, task_index: int, predictions: torch.Tensor, labels: torch.Tensor,
                     weights: torch.Tensor) -> None:
        batches = self._batches[task_index]
        batches.append(torch.stack([predictions, labels, weights]))
        excess = sum(batch.shape[1] for batch in batches) - self._window_size
        while excess > 0:
            oldest = batches[0]
            if oldest.shape[1] <= excess:
                batches.pop(0)
                excess -= oldest.shape[1]
            else:
                batches[0] = oldest[:, excess:]
                excess = 0

    def _local_states(self) -> List[torch.Tensor]:
        return [torch.cat(batches, dim=1) if batches else torch.zeros(3, 0, dtype=torch.float64)
                for batches in self._batches]

    def _reduce_states(self, states: List[torch.Tensor], group: Any) -> List[torch.Tensor]:
        return [all_gather_columns(samples, group) for samples in states]


class AUCMetric(SampleWindowMetric):
    """Window AUC per task, over all ranks' windows."""

    _namespace = "auc"
    _float32_values = frozenset({("window", "auc")})  # computed in float64, reported in TorchRec's float32

    def _task_values(self, states: List[torch.Tensor], task_index: int) -> Iterator[Tuple[str, str, torch.Tensor]]:
        predictions, labels, weights = states[task_index]
        yield "window", "auc", weighted_auc(predictions, labels, weights)


class AUCMetricComputation(SampleWindowComputation):
    """TorchRec's AUC computation: the window's samples (`predictions`, `labels`, `weights` lists, see
    SampleWindowComputation), the window AUC per task by compute_auc (`apply_bin` as TorchRec's); grouped_auc=True
    is refused (not implemented)."""

    _grouped_option = "grouped_auc"

    def __init__(self, *args: Any, apply_bin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._apply_bin = apply_bin

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.AUC, MetricPrefix.WINDOW,
                                        compute_auc(self._n_tasks, self.predictions, self.labels, self.weights,
                                                    self._apply_bin))]


__all__ = ["AUCMetric", "AUCMetricComputation", "SampleWindowMetric", "compute_auc", "compute_auc_per_group", "mean_over_groups",
           "torchrec_value_dtype", "weighted_auc"]
