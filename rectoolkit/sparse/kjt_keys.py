"""A KeyedJaggedTensor regrouped by its keys: one JaggedTensor per key and back, consecutive groups of keys,
keys reordered, and KJTs side by side.

Each key's lengths and values are one contiguous block of the KJT's tensors, so every regrouping here is slicing
at the per-key offsets and concatenating the slices; no value is looked at. The functions return the keyword
arguments of the resulting KJT (built unvalidated: its parts were valid), which the KeyedJaggedTensor methods of
the same names (``to_dict``, ``from_jt_dict``, ``split``, ``permute``, ``concat``) build:

    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 2]))
    >>> arguments = permute_arguments(kjt, ["b", "a"])
    >>> arguments["keys"], arguments["values"], arguments["lengths"]
    (['b', 'a'], tensor([2, 3, 1]), tensor([2, 1]))

A variable batch per key (``stride_per_key_per_rank``) keeps each key's row of it; as in TorchRec, split and
permute keep the KJT's stride and drop its inverse indices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from rectoolkit.sparse import validation
from rectoolkit.sparse.jagged_ops import batched_lengths_to_offsets, cat_or_empty, lengths_to_offsets
from rectoolkit.sparse.jagged_tensor import JaggedTensor

if TYPE_CHECKING:
    from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor

_OWNER = "KeyedJaggedTensor"


def jt_dict(kjt: KeyedJaggedTensor, compute_offsets: bool = True) -> Dict[str, JaggedTensor]:
    """{key: JaggedTensor}, in key order: views into the KJT's tensors."""
    keys = kjt.keys()
    length_per_key = kjt.length_per_key()
    if not length_per_key:
        return {}
    validation.check_not_padded(sum(length_per_key), kjt.values(), _OWNER, "to_dict")
    values = torch.split(kjt.values(), length_per_key)
    weights = kjt.weights_or_none()
    weights = torch.split(weights, length_per_key) if weights is not None else None
    if kjt.variable_stride_per_key():
        split_lengths = torch.split(kjt.lengths(), kjt.stride_per_key())
        split_offsets = [lengths_to_offsets(part) for part in split_lengths] if compute_offsets else None
    else:
        lengths_2d = kjt.lengths().view(len(keys), kjt.stride())
        split_lengths = lengths_2d.unbind(0)
        split_offsets = batched_lengths_to_offsets(lengths_2d).unbind(0) if compute_offsets else None
    return {
        key: JaggedTensor(
            values=values[i],
            weights=weights[i] if weights is not None else None,
            lengths=split_lengths[i],
            offsets=split_offsets[i] if split_offsets is not None else None,
            validate=False,
        )
        for i, key in enumerate(keys)
    }


def from_jt_dict_arguments(jts_by_key: Dict[str, JaggedTensor]) -> Dict[str, Any]:
    """One key per JaggedTensor, in the dict's order; all must have the same batch size."""
    keys = list(jts_by_key.keys())
    jts = list(jts_by_key.values())
    strides = [jt.lengths().numel() for jt in jts]
    variable = len(set(strides)) > 1  # then a variable batch per key, as TorchRec
    weighted = [jt.weights_or_none() is not None for jt in jts]
    if any(weighted) and not all(weighted):
        raise ValueError(f"{_OWNER}.from_jt_dict: some JaggedTensors have weights and some do not ({dict(zip(keys, weighted))})")
    return dict(
        keys=keys,
        values=torch.cat([jt.values() for jt in jts]),
        weights=torch.cat([jt.weights() for jt in jts]) if jts and all(weighted) else None,
        lengths=torch.cat([jt.lengths() for jt in jts]),
        stride=None if variable else (strides[0] if strides else None),
        stride_per_key_per_rank=[[stride] for stride in strides] if variable else None,
    )


def split_arguments(kjt: KeyedJaggedTensor, segments: List[int]) -> List[Optional[Dict[str, Any]]]:
    """For each segment, the arguments of a KJT of the next ``segment`` keys; None where the segment is all the
    keys (the KJT itself is that part)."""
    keys = kjt.keys()
    if any(segment < 0 for segment in segments) or sum(segments) > len(keys):
        raise validation.JaggedIndexError(
            f"{_OWNER}.split: segments {list(segments)} must be >= 0 and sum to at most the "
            f"{len(keys)} keys"
        )
    length_per_key = kjt.length_per_key()
    offset_per_key = kjt.offset_per_key()
    lengths_offset_per_key = kjt.lengths_offset_per_key()
    values, weights = kjt.values(), kjt.weights_or_none()
    # A variable batch per key keeps each part's rows of stride_per_key_per_rank; like TorchRec, the parts
    # keep this KJT's stride and drop the inverse indices.
    variable = kjt._stride_per_key_per_rank
    stride = kjt.stride()
    lengths = kjt.lengths()
    parts: List[Optional[Dict[str, Any]]] = []
    start = 0
    for segment in segments:
        end = start + segment
        part_strides = variable[start:end] if variable is not None else None
        if segment == len(keys):
            parts.append(None)
        elif segment == 0:
            parts.append(dict(
                keys=[],
                values=values.new_empty((0,) + tuple(values.shape[1:])),
                weights=weights.new_empty(0) if weights is not None else None,
                lengths=torch.empty(0, dtype=torch.int, device=kjt.device()),
                offsets=torch.empty(0, dtype=torch.int, device=kjt.device()),
                stride=stride,
                stride_per_key_per_rank=part_strides,
                validate=False,
            ))
        else:
            first, last = offset_per_key[start], offset_per_key[end]
            parts.append(dict(
                keys=keys[start:end],
                values=values[first:last],
                weights=weights[first:last] if weights is not None else None,
                lengths=lengths[lengths_offset_per_key[start] : lengths_offset_per_key[end]],
                stride=stride,
                stride_per_key_per_rank=part_strides,
                length_per_key=length_per_key[start:end],
                validate=False,
            ))
        start = end
    return parts


def permute_arguments(
    kjt: KeyedJaggedTensor, indices: Sequence[Union[int, str]], indices_tensor: Optional[torch.Tensor] = None
) -> Dict[str, Any]:
    """The arguments of a KJT whose key i is ``kjt``'s key ``indices[i]`` (an index or a key name)."""
    keys = kjt.keys()
    num_keys = len(keys)
    positions: List[int] = []
    for index in indices:
        if isinstance(index, str):
            positions.append(kjt._key_index(index))
        elif -num_keys <= index < num_keys:
            positions.append(index % num_keys)
        else:
            raise validation.JaggedIndexError(
                f"{_OWNER}.permute: index {index} is out of range for the {num_keys} keys "
                f"{validation._short_keys(keys)}"
            )
    length_per_key = kjt.length_per_key()
    offset_per_key = kjt.offset_per_key()
    lengths = kjt.lengths()
    values, weights = kjt.values(), kjt.weights_or_none()
    variable = kjt._stride_per_key_per_rank
    if variable is not None:  # a variable batch per key: each key's lengths are a block too
        lengths_offset_per_key = kjt.lengths_offset_per_key()
        return dict(
            keys=[keys[p] for p in positions],
            values=cat_or_empty([values[offset_per_key[p] : offset_per_key[p + 1]] for p in positions], values),
            weights=cat_or_empty([weights[offset_per_key[p] : offset_per_key[p + 1]] for p in positions],
                                 weights) if weights is not None else None,
            lengths=cat_or_empty(
                [lengths[lengths_offset_per_key[p] : lengths_offset_per_key[p + 1]] for p in positions], lengths),
            stride=kjt.stride(),
            stride_per_key_per_rank=[variable[p] for p in positions],
            length_per_key=[length_per_key[p] for p in positions] if positions else None,
            validate=False,
        )
    stride = kjt.stride()
    if indices_tensor is None or any(isinstance(index, str) for index in indices):
        indices_tensor = torch.tensor(positions, dtype=torch.long, device=lengths.device)
    # Each key's values are one contiguous block, so permuting keys is one cat of slices.
    value_blocks = [values[offset_per_key[p] : offset_per_key[p + 1]] for p in positions]
    if weights is not None:
        weights = cat_or_empty([weights[offset_per_key[p] : offset_per_key[p + 1]] for p in positions], weights)
    if lengths.numel() > 0 or num_keys == 0:
        permuted_lengths = lengths.view(num_keys, stride).index_select(0, indices_tensor.long()).view(-1)
    else:
        permuted_lengths = lengths
    return dict(
        keys=[keys[p] for p in positions],
        values=cat_or_empty(value_blocks, values),
        weights=weights,
        lengths=permuted_lengths,
        stride=stride,
        length_per_key=[length_per_key[p] for p in positions] if positions else None,
        validate=False,
    )


def concat_arguments(kjt_list: List[KeyedJaggedTensor]) -> Tuple[Dict[str, Any], List[int]]:
    """The arguments of the KJT with the keys of all ``kjt_list`` side by side, and its values per key.

    They must share the batch size and all (or none) be weighted."""
    if len(kjt_list) == 0:
        raise ValueError("Can't concat empty KJT list")
    # a KJT with no keys adds nothing (and its values, e.g. KeyedJaggedTensor.empty()'s float32, must not promote
    # the others' ids)
    kjt_list = [kjt for kjt in kjt_list if kjt.keys()] or kjt_list[:1]
    weighted = kjt_list[0].weights_or_none() is not None
    variable = [kjt.variable_stride_per_key() for kjt in kjt_list]
    if any(variable) and not all(variable):
        raise validation.JaggedAssertionError(f"{_OWNER}.concat: some KJTs have a variable batch per key and some do not ({variable}); "
                         "give all of them stride_per_key_per_rank, or none")
    with_inverse = [kjt.inverse_indices_or_none() is not None for kjt in kjt_list]
    if any(with_inverse) and not all(with_inverse):
        raise validation.JaggedAssertionError(f"{_OWNER}.concat: some KJTs have inverse_indices and some do not ({with_inverse}); "
                         "give all of them inverse indices, or none")
    strides = [kjt.stride() for kjt in kjt_list if kjt.keys()]
    if not all(variable) and len(set(strides)) > 1:
        raise validation.JaggedAssertionError(f"{_OWNER}.concat: the KJTs have different strides {strides}; they must share the batch size")
    keys: List[str] = []
    length_per_key: List[int] = []
    for kjt in kjt_list[:-1]:  # padding inside the result would shift the next KJT's values (TorchRec's does)
        validation.check_not_padded(sum(kjt._known_length_per_key()), kjt.values(), _OWNER, "concat")
    for kjt in kjt_list:
        if (kjt.weights_or_none() is not None) != weighted:
            raise ValueError("Can't merge weighted KJT with unweighted KJT")
        keys += kjt.keys()
        length_per_key += kjt._known_length_per_key()
    # As TorchRec's: the result's length_per_key_or_none() is set only where every input's was
    cached = all(kjt.length_per_key_or_none() is not None for kjt in kjt_list)
    inverse = None
    if all(with_inverse):
        inverse = ([k for kjt in kjt_list for k in kjt.inverse_indices()[0]],
                   torch.cat([kjt.inverse_indices()[1] for kjt in kjt_list]))
    arguments = dict(
        keys=keys,
        values=torch.cat([kjt.values() for kjt in kjt_list]),
        weights=torch.cat([kjt.weights() for kjt in kjt_list]) if weighted else None,
        lengths=torch.cat([kjt.lengths() for kjt in kjt_list]),
        stride=None if all(variable) else (strides[0] if strides else kjt_list[0].stride()),
        stride_per_key_per_rank=[row for kjt in kjt_list for row in kjt.stride_per_key_per_rank()]
        if all(variable) else None,
        length_per_key=length_per_key if cached else None,
        inverse_indices=inverse,
        validate=False,
    )
    return arguments, length_per_key
