"""A KeyedJaggedTensor's tensors elsewhere: moved to a device (``to``), in pinned host memory (``pin_memory``),
or as uninitialized buffers of the same shapes to copy into later (``empty_like``, then ``copy_``).

Each copy keeps the KJT's keys, strides and per-key caches, so that the copy never has to read its lengths back
from the device to find them again. The functions return the keyword arguments of the copy (built unvalidated:
the KJT was valid) and the values per key it already knows; the KeyedJaggedTensor methods of the same names
build it:

    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1, 2]), lengths=torch.tensor([2]),
    ...                         weights=torch.tensor([0.5, 1.0]))
    >>> arguments, _ = to_arguments(kjt, torch.device("meta"), dtype=torch.float16)
    >>> arguments["values"].device, arguments["weights"].dtype
    (device(type='meta'), torch.float16)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

if TYPE_CHECKING:
    from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor


def to_arguments(
    kjt: KeyedJaggedTensor, device: torch.device, non_blocking: bool = False, dtype: Optional[torch.dtype] = None
) -> Tuple[Dict[str, Any], Optional[List[int]]]:
    """The copy on ``device``; ``dtype`` converts the weights only (as in TorchRec)."""

    def move(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return tensor.to(device, non_blocking=non_blocking) if tensor is not None else None

    weights = kjt._weights
    if weights is not None:
        weights = weights.to(device=device, dtype=dtype, non_blocking=non_blocking)
    inverse = kjt._inverse_indices
    if inverse is not None:
        inverse = (inverse[0], inverse[1].to(device, non_blocking=non_blocking))
    arguments = dict(
        keys=kjt._keys,
        values=move(kjt._values),
        weights=weights,
        lengths=move(kjt._lengths),
        offsets=move(kjt._offsets),
        stride=kjt._stride,
        stride_per_key_per_rank=kjt._stride_per_key_per_rank,
        length_per_key=kjt._length_per_key,
        offset_per_key=kjt._offset_per_key,
        index_per_key=kjt._index_per_key,
        jt_dict=kjt._jt_dict,
        inverse_indices=inverse,
        validate=False,
    )
    return arguments, kjt._computed_length_per_key  # no device sync to find it again


def pin_memory_arguments(kjt: KeyedJaggedTensor) -> Tuple[Dict[str, Any], Optional[List[int]]]:
    """The copy in pinned host memory, lengths and offsets both (the missing one is computed first), so that a
    following `.to(device, non_blocking=True)` carries everything and the device never has to derive them."""

    def pin(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return tensor.pin_memory() if tensor is not None else None

    arguments = dict(
        keys=kjt._keys,
        values=pin(kjt._values),
        weights=pin(kjt._weights),
        lengths=pin(kjt.lengths()),
        offsets=pin(kjt.offsets()),
        stride=kjt._stride,
        stride_per_key_per_rank=kjt._stride_per_key_per_rank,
        length_per_key=kjt._length_per_key,
        offset_per_key=kjt._offset_per_key,
        index_per_key=kjt._index_per_key,
        inverse_indices=(kjt._inverse_indices[0], kjt._inverse_indices[1].pin_memory())
        if kjt._inverse_indices is not None else None,
        validate=False,
    )
    return arguments, kjt._computed_length_per_key


def empty_like_arguments(kjt: KeyedJaggedTensor, device: Optional[torch.device] = None) -> Dict[str, Any]:
    """No keys, same stride and dtypes (device=None); or same shapes, uninitialized, on ``device``."""
    if device is None:
        weights = kjt.weights_or_none()
        return dict(
            keys=[],
            values=kjt.values().new_empty(0),
            weights=weights.new_empty(0) if weights is not None else None,
            lengths=kjt.lengths().new_empty(0),
            stride=None if kjt.variable_stride_per_key() else kjt.stride(),
            stride_per_key_per_rank=kjt._stride_per_key_per_rank,
            validate=False,
        )

    def like(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return torch.empty_like(tensor, device=device) if tensor is not None else None

    return dict(
        keys=kjt.keys(),
        values=like(kjt._values),
        weights=like(kjt._weights),
        lengths=like(kjt._lengths),
        offsets=like(kjt._offsets),
        stride=None if kjt.variable_stride_per_key() else kjt.stride(),
        stride_per_key_per_rank=kjt._stride_per_key_per_rank,
        length_per_key=kjt._length_per_key,
        offset_per_key=kjt._offset_per_key,
        inverse_indices=(kjt._inverse_indices[0], like(kjt._inverse_indices[1]))
        if kjt._inverse_indices is not None else None,
        validate=False,
    )
