"""One process feeding several devices (inference), TorchRec's torchrec.distributed.dist_data modules for it:
KJTOneToAll cuts a KJT into per-device blocks (a KJTList); EmbeddingsAllToOne, EmbeddingsAllToOneReduce and
SeqEmbeddingsAllToOne bring the devices' embeddings back to one device, concatenated, summed or as a list. They are
plain torch copies, cats and sums here (TorchRec: fbgemm's merge ops), so they are differentiable on any device.

    >>> EmbeddingsAllToOne(torch.device("cpu"), world_size=2, cat_dim=1)([torch.ones(1, 2), torch.zeros(1, 1)])
    tensor([[1., 1., 0.]])
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from rectoolkit.distributed.interfaces import rank_device
from rectoolkit.distributed.kjt_lists import KJTList
from rectoolkit.sparse import KeyedJaggedTensor


class KJTOneToAll(nn.Module):
    """One process feeding `world_size` devices (inference): the KJT's keys cut into blocks of `splits`, block r
    copied to device r of `device`'s type (TorchRec's; "cpu" keeps them on the CPU, "meta" where they are; TorchRec
    1.8 sends a "cpu" device's blocks to CUDA unless its propagate-device setting is on)."""

    def __init__(self, splits: List[int], world_size: int, device: Optional[torch.device] = None) -> None:
        super().__init__()
        if len(splits) != world_size:
            raise ValueError(f"KJTOneToAll: splits={splits} has {len(splits)} entries for world_size={world_size}; "
                             "give the number of keys for each device")
        self._splits, self._world_size = list(splits), world_size
        self._device_type = "cpu" if device is None else torch.device(device).type

    def forward(self, kjt: KeyedJaggedTensor) -> KJTList:
        blocks = kjt.split(self._splits)
        if self._device_type == "meta":
            return KJTList(blocks)
        return KJTList([block.to(rank_device(self._device_type, rank), non_blocking=True)
                        for rank, block in enumerate(blocks)])


class MergePooledEmbeddingsModule(nn.Module):
    """Tensors from several devices concatenated along `cat_dim` on one device (fbgemm's merge_pooled_embeddings;
    TorchRec's), differentiable. `set_device` changes the device, as inference runtimes do."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.current_device = torch.device(device)

    def set_device(self, device_str: str) -> None:
        self.current_device = torch.device(device_str)

    def forward(self, tensors: List[torch.Tensor], cat_dim: int) -> torch.Tensor:
        return torch.cat([tensor.to(self.current_device) for tensor in tensors], dim=cat_dim)


class EmbeddingsAllToOne(nn.Module):
    """The pooled (cat_dim 1) or sequence (cat_dim 0) embeddings of up to `world_size` devices merged on `device`
    (TorchRec's; one device: its tensor as it is)."""

    def __init__(self, device: torch.device, world_size: int, cat_dim: int) -> None:
        super().__init__()
        self.merge_pooled_embeddings = MergePooledEmbeddingsModule(device)
        self._device, self._world_size, self._cat_dim = torch.device(device), world_size, cat_dim

    def set_device(self, device_str: str) -> None:
        self._device = torch.device(device_str)
        self.merge_pooled_embeddings.set_device(device_str)

    def forward(self, tensors: List[torch.Tensor]) -> torch.Tensor:
        _check_devices(tensors, self._world_size, "EmbeddingsAllToOne", exact=False)
        merged = tensors[0] if self._world_size == 1 else self.merge_pooled_embeddings(tensors, self._cat_dim)
        return merged.to(self._device) if self._device.type == "cpu" else merged


class EmbeddingsAllToOneReduce(nn.Module):
    """The sum on `device` of the `world_size` devices' pooled embeddings (TorchRec's, fbgemm's sum_reduce_to_one)."""

    def __init__(self, device: torch.device, world_size: int) -> None:
        super().__init__()
        self._device, self._world_size = torch.device(device), world_size

    def set_device(self, device_str: str) -> None:
        self._device = torch.device(device_str)

    def forward(self, tensors: List[torch.Tensor]) -> torch.Tensor:
        _check_devices(tensors, self._world_size, "EmbeddingsAllToOneReduce", exact=True)
        total = tensors[0].to(self._device)
        for tensor in tensors[1:]:
            total = total + tensor.to(self._device)
        return total


class SeqEmbeddingsAllToOne(nn.Module):
    """The `world_size` devices' sequence embeddings, each copied to `device` (TorchRec's; a list back)."""

    def __init__(self, device: torch.device, world_size: int) -> None:
        super().__init__()
        self._device, self._world_size = torch.device(device), world_size

    def set_device(self, device_str: str) -> None:
        self._device = torch.device(device_str)

    def forward(self, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
        _check_devices(tensors, self._world_size, "SeqEmbeddingsAllToOne", exact=True)
        return [tensor.to(self._device) for tensor in tensors]


def _check_devices(tensors: List[torch.Tensor], world_size: int, subject: str, exact: bool) -> None:
    if len(tensors) > world_size or (exact and len(tensors) != world_size) or not tensors:
        raise ValueError(f"{subject}: got {len(tensors)} tensors for world_size={world_size}; pass "
                         f"{'one per device' if exact else 'at least one and at most one per device'}")


__all__ = ["EmbeddingsAllToOne", "EmbeddingsAllToOneReduce", "KJTList", "KJTOneToAll", "MergePooledEmbeddingsModule",
           "SeqEmbeddingsAllToOne"]
