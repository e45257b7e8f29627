"""TorchRec's conversion modules and functions on the jagged types (torchrec.sparse.jagged_tensor).

ComputeKJTToJTDict and ComputeJTDictToKJT are nn.Modules around `kjt.to_dict()` and
`KeyedJaggedTensor.from_jt_dict()`, so a model can hold them (and fx can trace through them);
regroup_kts is `KeyedTensor.regroup` as a function.

    >>> kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=torch.tensor([1, 2, 3]),
    ...                                           lengths=torch.tensor([2, 0, 1, 0]))
    >>> jts = ComputeKJTToJTDict()(kjt)
    >>> jts["a"].lengths().tolist(), ComputeJTDictToKJT()(jts).values().tolist()
    ([2, 0], [1, 2, 3])
"""

from __future__ import annotations

from typing import Dict, List

import torch

from rectoolkit.sparse.jagged_tensor import JaggedTensor
from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from rectoolkit.sparse.keyed_tensor import KeyedTensor

__all__ = ["ComputeJTDictToKJT", "ComputeKJTToJTDict", "regroup_kts"]


class ComputeKJTToJTDict(torch.nn.Module):
    """A KeyedJaggedTensor to {key: JaggedTensor} (one per feature, weights included)."""

    def forward(self, keyed_jagged_tensor: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        return keyed_jagged_tensor.to_dict()


class ComputeJTDictToKJT(torch.nn.Module):
    """{key: JaggedTensor} to one KeyedJaggedTensor, keys in the dict's order."""

    def forward(self, jt_dict: Dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_jt_dict(jt_dict)


def regroup_kts(keyed_tensors: List[KeyedTensor], groups: List[List[str]]) -> List[torch.Tensor]:
    """One tensor per group: the groups' keys' columns, concatenated in the order given (KeyedTensor.regroup).

    >>> kt = KeyedTensor.from_tensor_list(["x", "y"], [torch.ones(2, 1), torch.zeros(2, 2)])
    >>> [t.shape[1] for t in regroup_kts([kt], [["y"], ["x", "y"]])]
    [2, 3]
    """
    return KeyedTensor.regroup(keyed_tensors, groups)
