"""TorchRec's torchrec.inference.state_dict_transform: a trained sharded model's state_dict turned into an unsharded
model's, for inference (collectives: every rank calls them, in the same order).

    state_dict_gather(dmp.state_dict(), model.state_dict())   fills the unsharded model's tensors on rank 0
    state_dict_all_gather_keys(state_dict, pg)                 every rank's keys, sorted
    state_dict_to_device(state_dict, pg, device)               the state_dict on `device`, ShardedTensors kept sharded

A DistributedModelParallel's sharded tables (and a sharded managed-collision collection's row blocks) are
ShardedTensors in its state_dict, as in TorchRec: they are gathered to rank 0 as TorchRec gathers them; plain
tensors (dense layers, DATA_PARALLEL tables) are copied as they are.
"""

from __future__ import annotations

from typing import Dict, List, Union

import torch
from torch import distributed as dist

__all__ = ["state_dict_all_gather_keys", "state_dict_gather", "state_dict_to_device"]


def _sharded_tensor_type():
    from torch.distributed._shard.sharded_tensor import ShardedTensor  # (70 ms to import: only when called)

    return ShardedTensor


def state_dict_gather(src: Dict[str, torch.Tensor], dst: Dict[str, torch.Tensor]) -> None:
    """For every key of `dst`, its value in `src` copied into it: a ShardedTensor is gathered into `dst`'s tensor on
    rank 0 (every rank must call this, as TorchRec's), a tensor copied on every rank. A key of `dst` missing from
    `src`, or a value of another kind, raises naming the key."""
    sharded = _sharded_tensor_type()
    missing = [key for key in dst if key not in src]
    if missing:
        raise KeyError(f"state_dict_gather: the source state_dict has no {missing[:5]} ({len(missing)} keys of the "
                       f"destination's {len(dst)}); gather from the state_dict of the same model")
    for key, dst_tensor in dst.items():
        src_tensor = src[key]
        if isinstance(src_tensor, sharded):
            src_tensor.gather(out=dst_tensor if dist.get_rank() == 0 else None, dtype=dst_tensor.dtype)
        elif isinstance(src_tensor, torch.Tensor):
            if tuple(src_tensor.shape) != tuple(dst_tensor.shape):
                raise ValueError(f"state_dict_gather: {key!r} is {list(src_tensor.shape)} in the source and "
                                 f"{list(dst_tensor.shape)} in the destination")
            with torch.no_grad():
                dst_tensor.copy_(src_tensor)
        else:
            raise ValueError(f"state_dict_gather: {key!r} is a {type(src_tensor).__name__}, not a tensor")


def state_dict_all_gather_keys(state_dict: Dict[str, torch.Tensor], pg: dist.ProcessGroup) -> List[str]:
    """The keys of every rank's `state_dict`, each once, sorted (a collective on `pg`)."""
    gathered: List[List[str]] = [[] for _ in range(dist.get_world_size(pg))]
    dist.all_gather_object(gathered, list(state_dict), group=pg)
    return sorted({key for keys in gathered for key in keys})


def state_dict_to_device(state_dict: Dict[str, torch.Tensor], pg: dist.ProcessGroup,
                         device: torch.device) -> Dict[str, Union[torch.Tensor, object]]:
    """`state_dict` with every tensor on `device`, under every rank's keys (sorted): a ShardedTensor stays one, its
    local shards moved; a key this rank lacks becomes an empty ShardedTensor, as in TorchRec (a collective on `pg`
    for every ShardedTensor key, in the same order on every rank)."""
    from torch.distributed._shard.sharded_tensor import Shard

    sharded = _sharded_tensor_type()
    moved: Dict[str, Union[torch.Tensor, object]] = {}
    for key in state_dict_all_gather_keys(state_dict, pg):
        tensor = state_dict.get(key)
        if tensor is None:  # another rank's ShardedTensor: this rank holds none of it
            moved[key] = sharded._init_from_local_shards([], [], process_group=pg)
        elif isinstance(tensor, sharded):
            shards = [Shard.from_tensor_and_offsets(shard.tensor.to(device), shard.metadata.shard_offsets,
                                                    rank=dist.get_rank(pg)) for shard in tensor.local_shards()]
            moved[key] = sharded._init_from_local_shards(shards, tensor.metadata().size, process_group=pg)
        elif isinstance(tensor, torch.Tensor):
            moved[key] = tensor.to(device)
        else:
            raise ValueError(f"state_dict_to_device: {key!r} is a {type(tensor).__name__}, not a tensor")
    return moved
