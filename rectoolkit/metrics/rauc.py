"""RAUC, regression AUC (`torchrec.metrics.rauc.RAUCMetric`): the share of the window's sample pairs that the
predictions order as the labels do,

    RAUC = 1 - #{(a, b): prediction_a < prediction_b and label_a > label_b} / (n (n - 1) / 2),

over the n samples of the window (`rauc-{task}|window_rauc`; there is no lifetime value, as in TorchRec). Pairs
with tied predictions or tied labels count as ordered. Predictions and labels are rounded to float32 first, as
TorchRec does, so ties are TorchRec's.

As TorchRec's, RAUC is unweighted: the weights are not read, so a sample of weight 0 counts in the pairs like any
other. This includes TorchRec's padding sample: a window that has received no sample since construction or
reset() holds one (prediction 0, label 0, weight 0), which compute() all-gathers and counts when world_size > 1
(a rank that has seen no batch adds one sample to the others'). A window of fewer than 2 samples over all ranks
is refused by name (TorchRec divides by zero).

The window is AUC's: the last ceil(window_size / world_size) samples per rank, the oldest batch cut mid-way.

    >>> regression_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0.0, 0.5, 1.0, 2.0]))
    tensor(0.8333, dtype=torch.float64)
"""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import torch

from rectoolkit.metrics.auc import SampleWindowMetric
from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetricException
from rectoolkit.metrics.sample_window_computation import SampleWindowComputation


def count_inversions(sequence: torch.Tensor) -> int:
    """The pairs i < j with sequence[i] > sequence[j], by a merge sort whose levels run as batched tensor ops.

        >>> count_inversions(torch.tensor([3.0, 1.0, 2.0, 2.0]))
        3
    """
    length = 1
    while length < sequence.numel():
        length *= 2
    # padding with +inf at the end adds no inversion: it is after and above everything
    blocks = torch.full((length,), float("inf"), dtype=torch.float64)
    blocks[:sequence.numel()] = sequence.double().flatten()
    inversions, width = 0, 1
    while width < length:
        pairs = blocks.view(-1, 2, width)  # each half already sorted
        left, right = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
        # every element of the left half above a right one is an inversion with it
        inversions += int((width - torch.searchsorted(left, right, right=True)).sum())
        width *= 2
        blocks = torch.sort(blocks.view(-1, width), dim=1).values.flatten()
    return inversions


def regression_auc(predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """RAUC of one task's samples (0-d float64), as TorchRec's: sort by (prediction, label), then one minus the
    share of the labels' inverted pairs."""
    predictions = predictions.float().double().flatten()
    labels = labels.float().double().flatten()
    count = predictions.numel()
    if count < 2:
        raise RecMetricException(f"RAUCMetric: the window holds {count} sample(s) over all ranks; RAUC needs 2 "
                                 "(TorchRec divides by zero); update() before compute()")
    order = torch.argsort(labels, stable=True)
    order = order[torch.argsort(predictions[order], stable=True)]  # by prediction, ties by label
    pairs = count * (count - 1) / 2
    return torch.tensor(1.0 - count_inversions(labels[order]) / pairs, dtype=torch.float64)


def count_reverse_pairs_divide_and_conquer(input: List[float]) -> float:
    """`torchrec.metrics.rauc.count_reverse_pairs_divide_and_conquer`: the share of the n(n-1)/2 pairs that are
    inverted; sorts `input` in place, as TorchRec's (fewer than 2 values: ZeroDivisionError, as TorchRec's)."""
    return divide(input, 0, len(input) - 1) / (len(input) * (len(input) - 1) / 2)


def divide(input: List[float], low: int, high: int) -> int:
    """`torchrec.metrics.rauc.divide`: the inverted pairs of input[low:high + 1], which it sorts in place."""
    if low >= high:
        return 0
    mid = (low + high) // 2
    return divide(input, low, mid) + divide(input, mid + 1, high) + conquer_and_count(input, low, mid, high)


def conquer_and_count(input: List[float], left_index: int, mid_index: int, right_index: int) -> int:
    """`torchrec.metrics.rauc.conquer_and_count`: merges input[left_index:mid_index + 1] and
    input[mid_index + 1:right_index + 1] in place (a merge step: each half sorted for a sorted result) and returns
    the pairs (left, right) with left > right it meets."""
    left, right = input[left_index:mid_index + 1], input[mid_index + 1:right_index + 1]
    merged, inversions, i, j = [], 0, 0, 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            inversions += len(left) - i  # the left values still waiting all sit above it
            j += 1
    input[left_index:right_index + 1] = merged + left[i:] + right[j:]
    return inversions


def _task_rauc(predictions: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One task's RAUC as TorchRec's helper returns it: [1] float32."""
    return regression_auc(predictions, labels).float().view(1)


def compute_rauc(n_tasks: int, predictions: List[torch.Tensor], labels: List[torch.Tensor],
                 weights: List[torch.Tensor]) -> torch.Tensor:
    """`torchrec.metrics.rauc.compute_rauc`: per-task RAUC (float32) of [n_tasks, n] samples (lists concatenated);
    weights unused, as TorchRec's; fewer than 2 samples refused by name (TorchRec: ZeroDivisionError)."""
    predictions_t, labels_t = torch.cat(predictions, dim=-1), torch.cat(labels, dim=-1)
    return torch.cat([_task_rauc(p, y) for p, y in zip(predictions_t, labels_t)])


def compute_rauc_per_group(n_tasks: int, predictions: List[torch.Tensor], labels: List[torch.Tensor],
                           weights: List[torch.Tensor], grouping_keys: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.rauc.compute_rauc_per_group`: per task, the mean RAUC over the groups of grouping_keys
    (a leading -1, TorchRec's padding key, dropped), float32; 0.5 without groups."""
    predictions_t, labels_t = torch.cat(predictions, dim=-1), torch.cat(labels, dim=-1)
    if grouping_keys.numel() and grouping_keys[0] == -1:
        grouping_keys = grouping_keys[1:]
    groups = torch.unique(grouping_keys)
    if not len(groups):
        return torch.full((len(predictions_t),), 0.5, dtype=torch.float32)
    per_task = [sum((_task_rauc(p[grouping_keys == g], y[grouping_keys == g]) for g in groups),
                    torch.zeros(1, dtype=torch.float32)) / len(groups) for p, y in zip(predictions_t, labels_t)]
    return torch.cat(per_task)


class RAUCMetricComputation(SampleWindowComputation):
    """TorchRec's RAUC computation: the window's samples (see SampleWindowComputation), the window RAUC per task by
    compute_rauc; grouped_rauc=True is refused (not implemented)."""

    _grouped_option = "grouped_rauc"

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.RAUC, MetricPrefix.WINDOW,
                                        compute_rauc(self._n_tasks, self.predictions, self.labels, self.weights))]


class RAUCMetric(SampleWindowMetric):
    """Window RAUC per task, over all ranks' windows (TorchRec's constructor; `grouped_rauc=True`, which reads
    `grouping_keys` from the model outputs, is not implemented and refused)."""

    _namespace = "rauc"
    _float32_values = frozenset({("window", "rauc")})  # computed in float64, reported in TorchRec's float32
    _options = {"grouped_rauc": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._options["grouped_rauc"]:
            raise NotImplementedError("RAUCMetric: grouped_rauc=True is not implemented in rectoolkit; pass False")

    def _local_states(self) -> List[torch.Tensor]:
        # TorchRec's padding sample (prediction, label, weight 0) stands in an empty window
        return [samples if samples.shape[1] else torch.zeros(3, 1, dtype=torch.float64)
                for samples in super()._local_states()]

    def _task_values(self, states: List[torch.Tensor], task_index: int) -> Iterator[Tuple[str, str, torch.Tensor]]:
        predictions, labels, _ = states[task_index]
        yield "window", "rauc", regression_auc(predictions, labels)


__all__ = ["RAUCMetric", "RAUCMetricComputation", "compute_rauc", "compute_rauc_per_group", "conquer_and_count",
           "count_inversions", "count_reverse_pairs_divide_and_conquer", "divide", "regression_auc"]
