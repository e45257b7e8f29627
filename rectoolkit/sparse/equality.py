"""TorchRec's equality checks for the jagged types (`torchrec.sparse.jagged_tensor.jt_is_equal`, `kjt_is_equal`):
two jagged tensors are equal when their values, weights, lengths and offsets are (close to) equal; a KJT also needs
the same keys in the same order, the same lengths and offsets per key and the same stride. A field that is None on
both sides counts as equal; None against a tensor, or tensors of different sizes, as different.

    >>> import torch
    >>> from rectoolkit.sparse.jagged_tensor import JaggedTensor
    >>> a = JaggedTensor(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([1, 2]))
    >>> b = JaggedTensor(values=torch.tensor([1.0, 2.0, 3.0]), offsets=torch.tensor([0, 1, 3]))
    >>> jt_is_equal(a, b), jt_is_equal(a, JaggedTensor(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([2, 1])))
    (True, False)
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def _same(first: Optional[Any], second: Optional[Any]) -> bool:
    if first is None or second is None:
        return first is None and second is None
    if isinstance(first, torch.Tensor):
        return first.size() == second.size() and bool(torch.allclose(first, second))
    return first == second


def jt_is_equal(jt_1: Any, jt_2: Any) -> bool:
    """True when both are JaggedTensors with equal values, weights, lengths and offsets (lengths and offsets are
    compared whichever of them each was built from)."""
    from rectoolkit.sparse.jagged_tensor import JaggedTensor

    if not isinstance(jt_1, JaggedTensor) or not isinstance(jt_2, JaggedTensor):
        return False
    return (_same(jt_1.values(), jt_2.values()) and _same(jt_1.weights_or_none(), jt_2.weights_or_none())
            and _same(jt_1.lengths(), jt_2.lengths()) and _same(jt_1.offsets(), jt_2.offsets()))


def kjt_is_equal(kjt_1: Any, kjt_2: Any) -> bool:
    """True when both are KeyedJaggedTensors with the same keys in the same order, equal values, lengths, weights
    and offsets, the same lengths and offsets per key, and the same stride."""
    from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor

    if not isinstance(kjt_1, KeyedJaggedTensor) or not isinstance(kjt_2, KeyedJaggedTensor):
        return False
    if list(kjt_1.keys()) != list(kjt_2.keys()):
        return False
    return (_same(kjt_1.values(), kjt_2.values()) and _same(kjt_1.lengths(), kjt_2.lengths())
            and _same(kjt_1.weights_or_none(), kjt_2.weights_or_none()) and _same(kjt_1.offsets(), kjt_2.offsets())
            and _same(kjt_1.length_per_key(), kjt_2.length_per_key())
            and _same(kjt_1.offset_per_key(), kjt_2.offset_per_key()) and kjt_1.stride() == kjt_2.stride())
