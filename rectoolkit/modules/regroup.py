"""TorchRec's regroup module (torchrec.modules.regroup): KeyedTensors regrouped into named tensors.

    >>> kts = [KeyedTensor.from_tensor_list(["f1", "f2", "f3"], [torch.ones(2, 4), torch.zeros(2, 8), torch.ones(2, 2)])]
    >>> out = KTRegroupAsDict(groups=[["f1", "f3"], ["f2"]], keys=["object", "user"])(kts)
    >>> {key: tuple(tensor.shape) for key, tensor in out.items()}
    {'object': (2, 6), 'user': (2, 8)}
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from rectoolkit.modules.configs import DataType, data_type_to_dtype
from rectoolkit.sparse import KeyedTensor

__all__ = ["KTRegroupAsDict"]


class KTRegroupAsDict(torch.nn.Module):
    """KeyedTensor.regroup_as_dict as a module: `groups` (the keys per output) named by `keys`.

    Args:
        groups: the KeyedTensor keys of each output tensor, in column order.
        keys: the name of each output.
        emb_dtype: the DataType the regrouped embeddings are cast to (TorchRec's or rectoolkit's enum, or its name);
            None keeps their own dtype. The packed INT4 / INT2 types are refused (torch cannot cast to them).
        multi_device: TorchRec's switch that moves its index buffers to the inputs' device on every call (a model
            loaded onto another device); rectoolkit's regroup keeps none and always runs where the inputs are, so
            True and False behave alike.
    """

    def __init__(self, groups: List[List[str]], keys: List[str], emb_dtype: Optional[Any] = None,
                 multi_device: bool = False) -> None:
        super().__init__()
        if len(groups) != len(keys):
            raise ValueError(f"KTRegroupAsDict: {len(groups)} groups but {len(keys)} keys; give one key per group")
        self._dtype = None if emb_dtype is None else _cast_dtype(emb_dtype)
        self._groups = groups
        self._keys = keys

    def forward(self, keyed_tensors: List[KeyedTensor]) -> Dict[str, torch.Tensor]:
        out = KeyedTensor.regroup_as_dict(keyed_tensors, self._groups, self._keys)
        if self._dtype is None:
            return out
        return {key: tensor.to(self._dtype) for key, tensor in out.items()}  # as TorchRec's cast before the permute


def _cast_dtype(emb_dtype: Any) -> torch.dtype:
    """The torch dtype of a DataType given as TorchRec's or rectoolkit's enum or its name."""
    name = str(getattr(emb_dtype, "name", emb_dtype)).upper()
    if name not in DataType.__members__:
        raise ValueError(f"KTRegroupAsDict(emb_dtype={emb_dtype!r}): not a DataType; use one of "
                         f"{list(DataType.__members__)} or None")
    dtype = data_type_to_dtype(DataType[name])
    if not (dtype.is_floating_point or dtype in (torch.int64, torch.int32, torch.int8, torch.uint8)):
        raise ValueError(f"KTRegroupAsDict(emb_dtype={name}): embeddings cannot be cast to the packed {dtype}; "
                         "use FP32, FP16, BF16 or an integer type of a whole byte, or None")
    return dtype
