"""The checks a KeyedJaggedTensor runs on its constructor arguments, and what they find out on the way.

A KJT with one batch size checks that ``len(keys) * stride`` lengths were given, that offsets and lengths
agree, that no length is negative and that the lengths sum to the number of values; a KJT with a variable batch
per key (``stride_per_key_per_rank``, see rectoolkit.sparse.variable_batch) checks the same per key. Both
return the stride and the number of values of each key they computed, so the KJT never sums its lengths twice.

    >>> check_arguments(["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 0, 2, 0]))
    (2, [1, 2])
    >>> check_arguments(["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 0, 2, 1]))
    Traceback (most recent call last):
    ...
    ValueError: KeyedJaggedTensor: lengths sum to 4 but values has only 3 entries (keys=['a', 'b'], stride=2); lengths[i] must count the values of sample i
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from rectoolkit.sparse import validation, variable_batch
from rectoolkit.sparse.jagged_ops import min_and_sum_per_row

_OWNER = "KeyedJaggedTensor"


def check_arguments(
    keys: List[str],
    values: torch.Tensor,
    weights: Optional[torch.Tensor] = None,
    lengths: Optional[torch.Tensor] = None,
    offsets: Optional[torch.Tensor] = None,
    stride: Optional[int] = None,
    stride_per_key_per_rank: Optional[List[List[int]]] = None,
    stride_per_key: Optional[List[int]] = None,
    length_per_key: Optional[List[int]] = None,
    inverse_indices: Optional[Tuple[List[str], torch.Tensor]] = None,
) -> Tuple[Optional[int], List[int]]:
    """Raise if the arguments do not make a well-formed KJT; else (the stride, the values of each key).

    With a variable batch per key the stride is returned as given (it may be None)."""
    validation.check_integer(lengths, "lengths", _OWNER)
    validation.check_integer(offsets, "offsets", _OWNER)
    validation.check_weights(values, weights, _OWNER)
    if stride_per_key_per_rank is not None:
        computed = _check_variable_batch(keys, values, lengths, offsets, stride_per_key_per_rank, stride_per_key,
                                         length_per_key, inverse_indices)
        return stride, computed
    num_lengths = lengths.numel() if lengths is not None else max(offsets.numel() - 1, 0)
    stride = validation.check_keys_and_stride(keys, num_lengths, stride, _OWNER)
    if offsets is not None:
        offset_lengths = validation.check_offsets(offsets, values, _OWNER, keys, stride)
        if lengths is not None and not torch.equal(lengths.to(offset_lengths.dtype), offset_lengths):
            raise ValueError(f"{_OWNER}: lengths do not match offsets; lengths must equal diff(offsets)")
        lengths = offset_lengths
    if len(keys) == 0 or num_lengths == 0:
        validation.check_total_length(0, values, _OWNER, f" (keys={validation._short_keys(keys)})")
        computed = [0] * len(keys)
    else:
        # One segment sum and one min, read back with a single .tolist().
        sum_dtype = torch.int32 if lengths.dtype == torch.int32 and values.size(0) < 2**31 else torch.int64
        *computed, min_length = min_and_sum_per_row(lengths.view(len(keys), stride), sum_dtype)
        validation.check_lengths_nonnegative(lengths, min_length, _OWNER, keys, stride)
        total = sum(computed)
        if total != values.size(0):  # the message (keys and all) is built only when it is needed
            validation.check_total_length(
                total, values, _OWNER, f" (keys={validation._short_keys(keys)}, stride={stride})"
            )
    _check_length_per_key(length_per_key, computed)
    if inverse_indices is not None:
        variable_batch.check_inverse_indices(inverse_indices, keys, [stride] * len(keys))
    return stride, computed


def _check_variable_batch(
    keys: List[str],
    values: torch.Tensor,
    lengths: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
    stride_per_key_per_rank: List[List[int]],
    stride_per_key: Optional[List[int]],
    length_per_key: Optional[List[int]],
    inverse_indices: Optional[Tuple[List[str], torch.Tensor]],
) -> List[int]:
    computed_strides = variable_batch.per_key_strides(stride_per_key_per_rank, keys)
    if stride_per_key is not None and list(stride_per_key) != computed_strides:
        raise ValueError(f"{_OWNER}: stride_per_key={list(stride_per_key)} but stride_per_key_per_rank "
                         f"sums to {computed_strides} per key")
    if offsets is not None:
        offset_lengths = validation.check_offsets(offsets, values, _OWNER)
        if lengths is not None and not torch.equal(lengths.to(offset_lengths.dtype), offset_lengths):
            raise ValueError(f"{_OWNER}: lengths do not match offsets; lengths must equal diff(offsets)")
        lengths = offset_lengths
    computed = variable_batch.check_lengths(keys, lengths, computed_strides, values.size(0))
    _check_length_per_key(length_per_key, computed)
    if inverse_indices is not None:
        variable_batch.check_inverse_indices(inverse_indices, keys, computed_strides)
    return computed


def _check_length_per_key(length_per_key: Optional[Sequence[int]], computed: List[int]) -> None:
    if length_per_key is not None and list(length_per_key) != computed:
        raise ValueError(f"{_OWNER}: length_per_key={list(length_per_key)} but the lengths sum to {computed} per key")
