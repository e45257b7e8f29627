"""How a KeyedJaggedTensor travels in an all-to-all: its tensors, their split sizes, and the rebuild.

An input all-to-all sends each destination rank its block of keys. The sender lists the tensors
(``dist_tensors``: lengths, values, then the per-key strides when the batch varies per key, then weights), names
them (``dist_labels``) and says how many entries of each go to each destination (``dist_splits``, from the
number of keys per destination). The receiver gets, for every source rank, that rank's block of its keys -
source-major - and ``dist_init`` rebuilds one KJT from them: ``recat`` reorders the (source rank, key)
segments into key-major order, and the batch is the sum over source ranks.

    >>> import torch
    >>> from rectoolkit import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.arange(6), lengths=torch.tensor([1, 0, 2, 1, 1, 1]))
    >>> kjt.dist_labels(), kjt.dist_splits([2, 1])
    (['lengths', 'values'], [[4, 2], [4, 2]])

Same labels, splits and rebuilt KJT as ``torchrec.KeyedJaggedTensor``'s methods of the same names.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

_OWNER = "KeyedJaggedTensor.dist_init"


def sum_by_splits(counts: List[int], splits: List[int]) -> List[int]:
    """The sums of consecutive runs of ``counts``, run i being ``splits[i]`` long.

    >>> sum_by_splits([1, 2, 3, 4], [1, 3])
    [1, 9]
    """
    if sum(splits) > len(counts) or any(split < 0 for split in splits):
        raise ValueError(
            f"KeyedJaggedTensor.dist_splits: key_splits={splits} must be >= 0 and sum to at most the "
            f"{len(counts)} keys; give the number of keys each destination gets"
        )
    sums, start = [], 0
    for split in splits:
        sums.append(sum(counts[start : start + split]))
        start += split
    return sums


def dist_labels(kjt: Any) -> List[str]:
    """Names of the tensors ``dist_tensors`` returns, in order."""
    labels = ["lengths", "values"]
    if kjt.variable_stride_per_key():
        labels.append("strides")
    if kjt.weights_or_none() is not None:
        labels.append("weights")
    return labels


def dist_splits(kjt: Any, key_splits: List[int]) -> List[List[int]]:
    """For each tensor of ``dist_tensors``: how many of its entries go to each destination, given
    ``key_splits[d]`` consecutive keys for destination d."""
    lengths_per_destination = sum_by_splits(kjt.stride_per_key(), key_splits)
    values_per_destination = sum_by_splits(kjt.length_per_key(), key_splits)
    splits = [lengths_per_destination, values_per_destination]
    if kjt.variable_stride_per_key():
        splits.append(list(key_splits))
    if kjt.weights_or_none() is not None:
        splits.append(values_per_destination)
    return splits


def dist_tensors(kjt: Any) -> List[torch.Tensor]:
    """The tensors an all-to-all sends: lengths, values, [per-key strides], [weights]."""
    tensors = [kjt.lengths(), kjt.values()]
    if kjt.variable_stride_per_key():
        tensors.append(torch.tensor(kjt.stride_per_key(), dtype=torch.int64, device=kjt.device()))
    if kjt.weights_or_none() is not None:
        tensors.append(kjt.weights())
    return tensors


def permute_segments(tensor: torch.Tensor, segment_sizes: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``tensor`` cut into consecutive segments of ``segment_sizes``, concatenated in ``order``.

    >>> permute_segments(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 1, 2]), torch.tensor([2, 0]))
    tensor([4, 5, 1, 2])
    """
    segment_sizes = segment_sizes.to(torch.int64)
    order = order.to(device=segment_sizes.device, dtype=torch.int64)
    starts = torch.cumsum(segment_sizes, 0) - segment_sizes
    picked_sizes = segment_sizes[order]
    picked_starts = starts[order]
    total = int(picked_sizes.sum())
    output_starts = torch.cumsum(picked_sizes, 0) - picked_sizes
    shift = torch.repeat_interleave(picked_starts - output_starts, picked_sizes, output_size=total)
    index = torch.arange(total, device=segment_sizes.device) + shift
    return tensor.index_select(0, index.to(tensor.device))


def _check_recat(recat: torch.Tensor, num_segments: int, segment_name: str) -> None:
    if recat.dim() != 1:
        raise ValueError(f"{_OWNER}: recat must be 1-D, got shape {list(recat.shape)}")
    if recat.numel() > 0:
        low, high = int(recat.min()), int(recat.max())
        if low < 0 or high >= num_segments:
            bad = low if low < 0 else high
            raise ValueError(
                f"{_OWNER}: recat holds {bad} but there are {num_segments} {segment_name}; recat indexes the "
                f"received (source rank, key) segments"
            )


def _split_tensors(tensors: List[torch.Tensor], variable_stride_per_key: bool):
    expected = ["lengths", "values"] + (["strides"] if variable_stride_per_key else [])
    if len(tensors) not in (len(expected), len(expected) + 1):
        raise ValueError(
            f"{_OWNER}: got {len(tensors)} tensors with variable_stride_per_key={variable_stride_per_key}; pass "
            f"{expected} and optionally weights after them (the order of dist_labels())"
        )
    lengths, values = tensors[0], tensors[1]
    strides = tensors[2] if variable_stride_per_key else None
    weights = tensors[len(expected)] if len(tensors) > len(expected) else None
    return lengths, values, strides, weights


def dist_init_arguments(keys: List[str], tensors: List[torch.Tensor], variable_stride_per_key: bool, num_workers: int,
                        recat: Optional[torch.Tensor], stride_per_rank: Optional[List[int]],
                        stagger: int = 1) -> Dict[str, Any]:
    """The KeyedJaggedTensor constructor arguments of the KJT ``dist_init`` rebuilds (see the module doc).

    ``tensors`` are the received lengths, values, [strides], [weights], source-major. Fixed batch:
    ``stride_per_rank[r]`` is source r's batch; recat reorders rows of that many lengths (one per (source, key)),
    or single lengths when the sources' batches differ. Variable batch per key: ``strides`` holds the samples of
    each (source, key); recat reorders those segments; ``stagger`` > 1 says the sources were numbered in
    ``stagger`` interleaved groups (their stride columns are put back in rank order). In the fixed-batch case
    the stagger is already in recat, as in TorchRec.
    """
    if num_workers < 1:
        raise ValueError(f"{_OWNER}: num_workers={num_workers}; it must be >= 1 (the number of source ranks)")
    if stagger < 1 or num_workers % stagger != 0:
        raise ValueError(f"{_OWNER}: stagger={stagger} must be >= 1 and divide num_workers={num_workers}")
    lengths, values, strides, weights = _split_tensors(tensors, variable_stride_per_key)
    if variable_stride_per_key:
        return _variable_batch_arguments(keys, lengths, values, strides, weights, num_workers, recat, stagger)
    if stride_per_rank is None:
        raise ValueError(f"{_OWNER}: stride_per_rank is required when variable_stride_per_key=False "
                         f"(the batch size of each of the {num_workers} source ranks)")
    if recat is not None:
        stride = stride_per_rank[0]
        if all(s == stride for s in stride_per_rank):
            if stride > 0:  # one row of `stride` lengths per (source, key)
                num_rows = lengths.numel() // stride
                _check_recat(recat, num_rows, f"rows of {stride} lengths")
                row_sizes = lengths.view(num_rows, stride).sum(1)
                lengths, values, weights = _permute_rows(lengths, values, weights, stride, row_sizes, recat)
        else:  # the sources' batches differ: recat reorders single lengths
            _check_recat(recat, lengths.numel(), "lengths")
            lengths, values, weights = _permute_rows(lengths, values, weights, 1, lengths.view(-1), recat)
    return dict(keys=keys, values=values, weights=weights, lengths=lengths, stride=sum(stride_per_rank))


def _permute_rows(lengths, values, weights, row_length, value_counts, recat):
    row_sizes = torch.full_like(value_counts, row_length, dtype=torch.int64)
    lengths = permute_segments(lengths.reshape(-1), row_sizes, recat)
    permuted_values = permute_segments(values, value_counts, recat)
    if weights is not None:
        weights = permute_segments(weights, value_counts, recat)
    return lengths, permuted_values, weights


def _variable_batch_arguments(keys, lengths, values, strides, weights, num_workers, recat, stagger):
    if strides.numel() != num_workers * len(keys):
        raise ValueError(
            f"{_OWNER}: the strides tensor has {strides.numel()} entries but num_workers={num_workers} x "
            f"{len(keys)} keys need {num_workers * len(keys)} (one per source rank and key)"
        )
    stride_per_key_per_rank = strides.view(num_workers, len(keys)).T.cpu()
    strides_cpu = strides.to(device="cpu", dtype=torch.int64)
    if recat is not None:
        _check_recat(recat, strides.numel(), "(source rank, key) segments")
        segment_ends = torch.cumsum(strides_cpu, 0)
        length_ends = torch.cumsum(lengths.to(torch.int64), 0).cpu()
        length_ends = torch.cat([torch.zeros(1, dtype=torch.int64), length_ends])
        value_counts = length_ends[segment_ends] - length_ends[segment_ends - strides_cpu]
        lengths = permute_segments(lengths, strides_cpu, recat.cpu())
        values = permute_segments(values, value_counts, recat.cpu())
        if weights is not None:
            weights = permute_segments(weights, value_counts, recat.cpu())
    if stride_per_key_per_rank.numel() == 0:
        stride_per_key_per_rank = torch.zeros((len(keys), 1), dtype=torch.int64)
    if stagger > 1:
        rank_order = torch.arange(num_workers).view(stagger, -1).T.reshape(-1)
        stride_per_key_per_rank = stride_per_key_per_rank[:, rank_order]
    return dict(keys=keys, values=values, weights=weights, lengths=lengths,
                stride_per_key_per_rank=stride_per_key_per_rank)
