"""The jagged types as torch.utils._pytree nodes, flattened as TorchRec 1.8 flattens them.

    JaggedTensor       leaves [values, weights, lengths, offsets]                              context None
    KeyedJaggedTensor  leaves [values, weights, lengths, offsets, stride_per_key_per_rank,     context keys
                               inverse_indices tensor]
    KeyedTensor        leaves [values]                                                         context (keys,
                                                                                               length_per_key)

A field the object does not hold is a None leaf (offsets not computed yet, unweighted, one batch size), so
tree_map, torch.export and torch.fx see the same leaves as in TorchRec; stride_per_key_per_rank is an int32
tensor [keys, ranks] there, as TorchRec stores it. Each class module calls `register_node` once, at import.

    >>> import torch.utils._pytree as pytree
    >>> from rectoolkit.sparse import JaggedTensor
    >>> jt = JaggedTensor(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2, 0]))
    >>> leaves, spec = pytree.tree_flatten(jt)
    >>> leaves
    [tensor([1., 2.]), None, tensor([2, 0]), None]
    >>> pytree.tree_unflatten([leaves[0] * 10] + leaves[1:], spec).values()
    tensor([10., 20.])
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

Flatten = Callable[[Any], Tuple[List[Any], Any]]


def register_node(cls: type, fields: Sequence[str], flatten: Flatten, unflatten: Callable[[List[Any], Any], Any]) -> None:
    """Register `cls` with torch.utils._pytree (with keys: one GetAttrKey per field, TorchRec's) and torch.fx."""

    def flatten_with_keys(node):
        leaves, context = flatten(node)
        return [(pytree.GetAttrKey(name), leaf) for name, leaf in zip(fields, leaves)], context

    pytree.register_pytree_node(cls, flatten, unflatten, flatten_with_keys_fn=flatten_with_keys,
                                serialized_type_name=f"{cls.__module__}.{cls.__name__}")
    fx_pytree.register_pytree_flatten_spec(cls, lambda node, spec: flatten(node)[0])


def strides_tensor(stride_per_key_per_rank) -> Any:
    """A KJT's per-key, per-rank batch sizes as the int32 tensor leaf TorchRec flattens (None: one batch size)."""
    if stride_per_key_per_rank is None:
        return None
    return torch.tensor(stride_per_key_per_rank, dtype=torch.int32)
