"""Variable batch size per key (VBE): the checks and per-key arithmetic of a KJT whose keys have their own stride.

A VBE KJT carries ``stride_per_key_per_rank``: for key k, the samples each rank contributed (a single
process has one "rank": ``[[3], [12]]`` says key 0 has 3 samples and key 1 has 12). Its lengths hold
``sum(stride_per_key)`` entries, key by key. ``inverse_indices = (keys, tensor[len(keys), B])`` says, for
every sample b of the full batch, which of the key's (deduplicated) samples it uses; the collections expand
their pooled output with it (``user`` pooled once, then read by each of its 12 candidates).

    >>> per_key_strides([[1, 2], [3, 0]], ["user", "item"])
    [3, 3]
    >>> sum_per_key(torch.tensor([2, 0, 1,  1, 1, 1]), [3, 3])
    [3, 3]
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from rectoolkit.sparse.validation import _short_keys

_OWNER = "KeyedJaggedTensor"


def as_lists(stride_per_key_per_rank: Union[torch.Tensor, List[List[int]], None]) -> Optional[List[List[int]]]:
    """The constructor's argument as plain lists (TorchRec accepts an IntTensor [keys, ranks] or lists)."""
    if stride_per_key_per_rank is None:
        return None
    if isinstance(stride_per_key_per_rank, torch.Tensor):
        return stride_per_key_per_rank.tolist()
    return [list(row) for row in stride_per_key_per_rank]


def per_key_strides(stride_per_key_per_rank: List[List[int]], keys: Sequence[str]) -> List[int]:
    """Samples per key (the sum over ranks), after checking one row per key of counts >= 0."""
    if len(stride_per_key_per_rank) != len(keys):
        raise ValueError(
            f"{_OWNER}: stride_per_key_per_rank has {len(stride_per_key_per_rank)} rows but there are {len(keys)} "
            f"keys {_short_keys(keys)}; give one row per key (the samples of that key on each rank)"
        )
    for key, row in zip(keys, stride_per_key_per_rank):
        if any(count < 0 for count in row):
            raise ValueError(f"{_OWNER}: stride_per_key_per_rank of key {key!r} is {row}; sample counts must be >= 0")
    return [sum(row) for row in stride_per_key_per_rank]


def sum_per_key(lengths: torch.Tensor, stride_per_key: Sequence[int]) -> List[int]:
    """Values per key: the sum of each key's run of ``stride_per_key[k]`` lengths (one read-back)."""
    if not stride_per_key:
        return []
    if lengths.numel() == 0:
        return [0] * len(stride_per_key)
    key_of_sample = torch.repeat_interleave(
        torch.arange(len(stride_per_key), device=lengths.device),
        torch.tensor(list(stride_per_key), device=lengths.device),
        output_size=lengths.numel(),
    )
    sums = torch.zeros(len(stride_per_key), dtype=torch.int64, device=lengths.device)
    return sums.index_add_(0, key_of_sample, lengths.to(torch.int64)).tolist()


def describe_sample(position: int, keys: Sequence[str], stride_per_key: Sequence[int]) -> str:
    """"key 'item', sample 4" for a flat index into a VBE KJT's lengths."""
    start = 0
    for key, stride in zip(keys, stride_per_key):
        if position < start + stride:
            return f"key {key!r}, sample {position - start}"
        start += stride
    return f"sample {position}"


def check_lengths(keys: Sequence[str], lengths: torch.Tensor, stride_per_key: List[int],
                  num_values: int) -> List[int]:
    """Check a VBE KJT's lengths against its strides and values; returns the values per key."""
    if lengths.numel() != sum(stride_per_key):
        strides = dict(zip(keys, stride_per_key))
        raise ValueError(
            f"{_OWNER}: lengths has {lengths.numel()} entries but stride_per_key_per_rank gives {sum(stride_per_key)} "
            f"samples in all ({strides}); lengths must hold one entry per sample of each key"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        position = int(torch.nonzero(lengths < 0)[0, 0])
        raise ValueError(
            f"{_OWNER}: lengths must be >= 0 but {describe_sample(position, keys, stride_per_key)} has length "
            f"{int(lengths[position])}"
        )
    per_key = sum_per_key(lengths, stride_per_key)
    if sum(per_key) != num_values:
        raise ValueError(
            f"{_OWNER}: lengths sum to {sum(per_key)} but values has {num_values} entries "
            f"(keys={_short_keys(keys)}, stride_per_key={list(stride_per_key)}); lengths[i] must count the values "
            "of sample i"
        )
    return per_key


def check_inverse_indices(inverse_indices: Tuple[List[str], torch.Tensor], keys: Sequence[str],
                          stride_per_key: Sequence[int]) -> None:
    """inverse_indices = (keys, [len(keys), B] integer tensor) whose row for key k reads samples 0..stride(k)-1."""
    inverse_keys, indices = inverse_indices
    if indices.is_floating_point() or indices.dim() != 2 or indices.size(0) != len(inverse_keys):
        raise ValueError(
            f"{_OWNER}: inverse_indices must be (keys, an integer tensor [len(keys), batch size]); got "
            f"{len(inverse_keys)} keys and a {indices.dtype} tensor of shape {list(indices.shape)}"
        )
    stride_of = dict(zip(keys, stride_per_key))
    for row, key in enumerate(inverse_keys):
        if key not in stride_of or indices.size(1) == 0:
            continue
        smallest, largest = (int(x) for x in torch.aminmax(indices[row]))
        if smallest < 0 or largest >= stride_of[key]:
            bad = smallest if smallest < 0 else largest
            raise ValueError(
                f"{_OWNER}: inverse_indices of key {key!r} hold {bad}, but the key has {stride_of[key]} samples; "
                f"each inverse index must be in [0, {stride_of[key]})"
            )
