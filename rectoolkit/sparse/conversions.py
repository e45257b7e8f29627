"""TorchRec's conversion modules and functions on the jagged types (torchrec.sparse.jagged_tensor).

ComputeKJTToJTDict and ComputeJTDictToKJT are nn.Modules around `kjt.to_dict()` and
`KeyedJaggedTensor.from_jt_dict()`, so a model can hold them (and fx can trace through them);
regroup_kts is `KeyedTensor.regroup` as a function (a key in several KeyedTensors taken from the first, as TorchRec's); flatten_kjt_list / unflatten_kjt_list turn a list of KJTs
into their pytree leaves (``len(KeyedJaggedTensor._fields)`` per KJT) and keys, and back.

    >>> kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b"], values=torch.tensor([1, 2, 3]),
    ...                                           lengths=torch.tensor([2, 0, 1, 0]))
    >>> jts = ComputeKJTToJTDict()(kjt)
    >>> jts["a"].lengths().tolist(), ComputeJTDictToKJT()(jts).values().tolist()
    ([2, 0], [1, 2, 3])
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from rectoolkit.sparse.jagged_tensor import JaggedTensor
from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor, _kjt_flatten, _kjt_unflatten
from rectoolkit.sparse.keyed_tensor import KeyedTensor

__all__ = ["ComputeJTDictToKJT", "ComputeKJTToJTDict", "flatten_kjt_list", "regroup_kts", "unflatten_kjt_list"]


class ComputeKJTToJTDict(torch.nn.Module):
    """A KeyedJaggedTensor to {key: JaggedTensor} (one per feature, weights included)."""

    def forward(self, keyed_jagged_tensor: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        return keyed_jagged_tensor.to_dict()


class ComputeJTDictToKJT(torch.nn.Module):
    """{key: JaggedTensor} to one KeyedJaggedTensor, keys in the dict's order."""

    def forward(self, jt_dict: Dict[str, JaggedTensor]) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_jt_dict(jt_dict)


def regroup_kts(keyed_tensors: List[KeyedTensor], groups: List[List[str]]) -> List[torch.Tensor]:
    """One tensor per group: the groups' keys' columns, concatenated in the order given (KeyedTensor.regroup; a key
    in several KeyedTensors is taken from the first, as TorchRec's fbgemm kernel takes it).

    >>> kt = KeyedTensor.from_tensor_list(["x", "y"], [torch.ones(2, 1), torch.zeros(2, 2)])
    >>> [t.shape[1] for t in regroup_kts([kt], [["y"], ["x", "y"]])]
    [2, 3]
    """
    return KeyedTensor._regroup(keyed_tensors, groups, "regroup_kts", first_wins=True)


def permute_multi_embedding(keyed_tensors: List[KeyedTensor], groups: List[List[str]]) -> List[torch.Tensor]:
    """TorchRec's other name for the same regrouping (there: fbgemm's permute_multi_embedding kernel; here the one
    regroup, KeyedTensor.regroup): one tensor per group, a key may be in several groups.

    >>> kt = KeyedTensor.from_tensor_list(["x", "y"], [torch.ones(2, 1), torch.zeros(2, 2)])
    >>> [t.shape[1] for t in permute_multi_embedding([kt], [["y", "x"], ["x"]])]
    [3, 1]
    """
    return regroup_kts(keyed_tensors, groups)


def flatten_kjt_list(kjts: List[KeyedJaggedTensor]) -> Tuple[List[Optional[torch.Tensor]], List[List[str]]]:
    """Every KJT's pytree leaves, one after the other, and each KJT's keys.

    >>> leaves, keys = flatten_kjt_list([KeyedJaggedTensor(["a"], torch.tensor([7]), lengths=torch.tensor([1]))])
    >>> len(leaves), keys
    (6, [['a']])
    """
    leaves: List[Optional[torch.Tensor]] = []
    for kjt in kjts:
        leaves.extend(_kjt_flatten(kjt)[0])
    return leaves, [kjt.keys() for kjt in kjts]


def unflatten_kjt_list(leaves: List[Optional[torch.Tensor]], contexts: List[List[str]]) -> List[KeyedJaggedTensor]:
    """The KJTs back from flatten_kjt_list's leaves and keys."""
    per_kjt = len(KeyedJaggedTensor._fields)
    if len(leaves) != per_kjt * len(contexts):
        raise ValueError(f"unflatten_kjt_list: {len(leaves)} leaves for {len(contexts)} KJTs; each KJT has {per_kjt} "
                         "(pass what flatten_kjt_list returned)")
    return [_kjt_unflatten(leaves[i * per_kjt : (i + 1) * per_kjt], keys) for i, keys in enumerate(contexts)]
