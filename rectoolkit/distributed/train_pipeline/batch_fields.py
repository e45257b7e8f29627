"""Where a batch's parts are: the pipelines find which field of the batch feeds each sharded collection (a path of
attribute names, keys and indices) and follow that path in later batches.

    >>> from typing import NamedTuple
    >>> class Batch(NamedTuple):
    ...     dense: torch.Tensor
    ...     sparse: dict
    >>> ids = torch.tensor([1, 2])
    >>> batch = Batch(torch.zeros(2), {"ids": ids})
    >>> path_to(batch, ids)
    ('sparse', ('ids',))
    >>> follow(batch, ('sparse', ('ids',))) is ids
    True
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Tuple

import torch

__all__ = ["FieldPath", "fields", "follow", "path_to", "tensors_of"]

FieldPath = Tuple[Any, ...]  # attribute names (str) / keys / indices from the batch to a collection's input


def fields(batch: Any) -> List[Tuple[Any, Any]]:
    """(name or key or index, value) of a batch's parts: a NamedTuple's or dataclass's fields, a dict's items,
    a tuple's or list's entries, an object's attributes."""
    if isinstance(batch, torch.Tensor) or batch is None:
        return []
    if hasattr(batch, "_fields"):
        return [(name, getattr(batch, name)) for name in batch._fields]
    if dataclasses.is_dataclass(batch):
        return [(f.name, getattr(batch, f.name)) for f in dataclasses.fields(batch)]
    if isinstance(batch, dict):
        return [((key,), value) for key, value in batch.items()]  # a tuple: a key, not an attribute name
    if isinstance(batch, (tuple, list)):
        return [((index,), value) for index, value in enumerate(batch)]
    return list(getattr(batch, "__dict__", {}).items())


def path_to(batch: Any, target: Any, depth: int = 2) -> Optional[FieldPath]:
    """How to reach `target` (the very object) from `batch`: () for the batch itself, else field names/keys."""
    if target is None:
        return None
    if batch is target:
        return ()
    if depth == 0:
        return None
    for name, value in fields(batch):
        rest = path_to(value, target, depth - 1)
        if rest is not None:
            return (name, *rest)
    return None


def follow(batch: Any, path: FieldPath) -> Any:
    """The part of `batch` at `path` (as path_to gives it)."""
    for step in path:
        batch = batch[step[0]] if isinstance(step, tuple) else getattr(batch, step)
    return batch


def tensors_of(batch: Any) -> List[torch.Tensor]:
    """Every tensor in a batch (fields, KJT values / lengths / weights), for record_stream."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if hasattr(batch, "values") and hasattr(batch, "lengths") and callable(batch.lengths):  # a KJT / JT
        parts = [batch.values(), batch.lengths(), batch.weights_or_none()]
        return [t for t in parts if isinstance(t, torch.Tensor)]
    return [t for _, value in fields(batch) for t in tensors_of(value)]
