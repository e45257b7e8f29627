"""TorchRec's regroup module (torchrec.modules.regroup): KeyedTensors regrouped into named tensors.

    >>> kts = [KeyedTensor.from_tensor_list(["f1", "f2", "f3"], [torch.ones(2, 4), torch.zeros(2, 8), torch.ones(2, 2)])]
    >>> out = KTRegroupAsDict(groups=[["f1", "f3"], ["f2"]], keys=["object", "user"])(kts)
    >>> {key: tuple(tensor.shape) for key, tensor in out.items()}
    {'object': (2, 6), 'user': (2, 8)}
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from rectoolkit.sparse import KeyedTensor

__all__ = ["KTRegroupAsDict"]


class KTRegroupAsDict(torch.nn.Module):
    """KeyedTensor.regroup_as_dict as a module: `groups` (the keys per output) named by `keys`.

    Args:
        groups: the KeyedTensor keys of each output tensor, in column order.
        keys: the name of each output.
        emb_dtype: the outputs' DataType: None or FP32 (the embeddings' own dtype); others are refused.
        multi_device: TorchRec's switch for its fbgemm buffers; rectoolkit keeps none, so only False.
    """

    def __init__(self, groups: List[List[str]], keys: List[str], emb_dtype: Optional[Any] = None,
                 multi_device: bool = False) -> None:
        super().__init__()
        if len(groups) != len(keys):
            raise ValueError(f"KTRegroupAsDict: {len(groups)} groups but {len(keys)} keys; give one key per group")
        if emb_dtype is not None and getattr(emb_dtype, "name", str(emb_dtype)).upper() != "FP32":
            raise NotImplementedError(f"KTRegroupAsDict(emb_dtype={emb_dtype}): casting the regrouped embeddings is "
                                      "not implemented; leave emb_dtype None (or FP32) and cast the outputs yourself")
        if multi_device:
            raise NotImplementedError("KTRegroupAsDict(multi_device=True): rectoolkit's regroup keeps no device "
                                      "buffers to move; leave it False")
        self._groups = groups
        self._keys = keys

    def forward(self, keyed_tensors: List[KeyedTensor]) -> Dict[str, torch.Tensor]:
        return KeyedTensor.regroup_as_dict(keyed_tensors, self._groups, self._keys)
