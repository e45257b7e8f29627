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
from rectoolkit.metrics.rec_metric import RecMetricException


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


__all__ = ["RAUCMetric", "count_inversions", "regression_auc"]
