"""A table's shards and their fused optimizer state as torch ShardedTensors, in TorchRec's layout.

TorchRec's fused optimizer (`dmp.fused_optimizer`) holds each table as one ShardedTensor param and each of its
optimizer states as a ShardedTensor: this rank's shards as local shards, every rank's shards in the global metadata.
`torch.distributed.checkpoint` (DCP) saves each rank's part of such a tensor and reshards on load; a plain tensor
under the same key on every rank is taken for a replica and saved once, so per-rank optimizer state saved plain would
be lost. The layouts are TorchRec 1.8's (so a DCP checkpoint of either library's optimizer loads into the other's):

    the weight        the table's shape; one global shard per plan shard, the plan's order
    pointwise state   (Adagrad's momentum, Adam's moments: the shard's shape) laid out as the weight
    rowwise state     (row-wise Adagrad: one value per row) 1-D, sharded by rows: a row-wise table's rows; a
                      column-wise table's shards (by column offset) stacked one after the other, rows x shards long;
                      grid shards the same, rolling over their rows
    one value         (a state of one element, other than "momentum1") one entry per global shard

The local tensors are the kernel's own (views, no copy): loading into them loads the kernel.

    >>> from rectoolkit.plan.types import ShardMetadata
    >>> shards = [ShardMetadata([0, 0], [4, 2], "rank:0/cpu"), ShardMetadata([0, 2], [4, 2], "rank:1/cpu")]
    >>> layout = rowwise_layout(shards, rows=4, dim=4, local=shards[1], local_world_size=2)
    >>> [(s.shard_offsets, s.shard_sizes) for s in layout.shards_metadata], list(layout.size)
    ([([0], [4]), ([4], [4])], [8])
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata as TorchShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

from rectoolkit.plan.types import ShardMetadata

__all__ = ["ShardedTensor", "sharded_tensor_group", "global_ranks", "weight_sharded_tensor", "table_sharded_tensors", "rowwise_layout", "copy_into_sharded"]


def sharded_tensor_group(env) -> Optional[dist.ProcessGroup]:
    """The process group a collection's ShardedTensors live on, or None where there are none: without
    torch.distributed, or on an environment that is not a process group's (ranks held in one process). On a group of
    part of the world (a 2D layout's sharding group) the shards are placed by global rank, as torch's ShardedTensor
    places them (`global_ranks`). Where there is none the optimizer holds this rank's tensors plainly."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = env.pg if env.pg is not None else dist.group.WORLD
    if env.pg is None and env.world_size != dist.get_world_size():
        return None
    if dist.get_world_size(group) != env.world_size or dist.get_rank(group) != env.rank:
        return None  # (this process is not the environment's rank of that group)
    return group


def global_ranks(group: Optional[dist.ProcessGroup]) -> List[int]:
    """Each rank of `group` (a plan's rank) as its global rank (what a ShardedTensor placement names)."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return dist.get_process_group_ranks(group)


def _torch_metadata(offsets: Sequence[int], sizes: Sequence[int], placement: str) -> TorchShardMetadata:
    return TorchShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes), placement=placement)


def _properties(tensor: torch.Tensor) -> TensorProperties:
    return TensorProperties(dtype=tensor.dtype, layout=tensor.layout, requires_grad=tensor.requires_grad)


def _placed(shard: ShardMetadata, device, rank: Optional[int], ranks: Optional[Sequence[int]] = None) -> str:
    """The shard's placement: this rank's on `device` (where its tensor is: torch checks the two agree), another
    rank's on the device the plan places it (all on `device` when `rank` is None). `rank` and the shard's rank are
    the plan's (its group's); the placement names the global rank, `ranks[plan rank]` (the same without `ranks`)."""
    where = device if rank is None or shard.rank == rank else shard.device
    return f"rank:{shard.rank if ranks is None else ranks[shard.rank]}/{where}"


def _same_shard(a: ShardMetadata, b: ShardMetadata) -> bool:
    return list(a.shard_offsets) == list(b.shard_offsets) and list(a.shard_sizes) == list(b.shard_sizes)


def rowwise_layout(shards: Sequence[ShardMetadata], rows: int, dim: int, local: ShardMetadata,
                   local_world_size: int, dtype: torch.dtype = torch.float32,
                   device: str = "cpu", rank: Optional[int] = None,
                   ranks: Optional[Sequence[int]] = None) -> ShardedTensorMetadata:
    """TorchRec's layout of a rowwise state (one value per row of each shard). Column-wise and grid tables are
    told from this rank's shard `local`, as TorchRec tells them (its columns not the table's: column-wise; its rows
    not the table's either: grid)."""
    column_split = local.shard_sizes[1] != dim
    grid = column_split and local.shard_sizes[0] != rows
    ordered = sorted(shards, key=lambda s: s.shard_offsets[1]) if column_split else list(shards)
    metadata, rolling = [], 0
    for index, shard in enumerate(ordered):
        offset = shard.shard_offsets[0]
        if grid:
            offset, rolling = rolling, rolling + shard.shard_sizes[0]
        elif column_split:
            offset = index * shard.shard_sizes[0]
        metadata.append(_torch_metadata([offset], [shard.shard_sizes[0]], _placed(shard, device, rank, ranks)))
    stacked = len(ordered) if column_split and not grid else 1
    grid_nodes = len(ordered) // local_world_size if grid else 1
    return ShardedTensorMetadata(shards_metadata=metadata, size=torch.Size([rows * stacked * grid_nodes]),
                                 tensor_properties=TensorProperties(dtype=dtype, requires_grad=False))


def _state_layout(name: str, value: torch.Tensor, shards: Sequence[ShardMetadata], rows: int, dim: int,
                  local: ShardMetadata, local_world_size: int, rank: int,
                  ranks: Sequence[int]) -> Tuple[ShardedTensorMetadata, List[int]]:
    """The global layout of one state and, per global shard (plan order), its index in that layout."""
    device = str(value.device)
    if value.numel() == 1 and not name.endswith(".momentum1"):  # one value per shard (TorchRec's test, as it is)
        metadata = [_torch_metadata([i], [1], _placed(s, device, rank, ranks)) for i, s in enumerate(shards)]
        layout = ShardedTensorMetadata(shards_metadata=metadata, size=torch.Size([len(shards)]),
                                       tensor_properties=TensorProperties(dtype=value.dtype, requires_grad=False))
        return layout, list(range(len(shards)))
    if value.dim() == 1:
        layout = rowwise_layout(shards, rows, dim, local, local_world_size, value.dtype, device, rank, ranks)
        column_split = local.shard_sizes[1] != dim
        order = sorted(range(len(shards)), key=lambda i: shards[i].shard_offsets[1]) if column_split \
            else list(range(len(shards)))
        position = {shard_index: k for k, shard_index in enumerate(order)}
        return layout, [position[i] for i in range(len(shards))]
    metadata = [_torch_metadata(s.shard_offsets, s.shard_sizes, _placed(s, device, rank, ranks)) for s in shards]
    layout = ShardedTensorMetadata(shards_metadata=metadata, size=torch.Size([rows, dim]),
                                   tensor_properties=TensorProperties(dtype=value.dtype, requires_grad=False))
    return layout, list(range(len(shards)))


def _plan_positions(table: str, shards: Sequence[ShardMetadata], local: Sequence[ShardMetadata]) -> List[int]:
    """The index in `shards` (the plan's, every rank's) of each of this rank's shards `local`."""
    where = []
    for shard in local:
        matches = [i for i, s in enumerate(shards) if _same_shard(s, shard) and s.rank == shard.rank]
        if len(matches) != 1:
            raise ValueError(f"table {table!r}: this rank's shard at {shard.shard_offsets} of {shard.shard_sizes} is "
                             f"not one of the plan's shards {[(s.shard_offsets, s.shard_sizes) for s in shards]}")
        where.append(matches[0])
    return where


def weight_sharded_tensor(table: str, rows: int, dim: int, shards: Sequence[ShardMetadata],
                          local: Sequence[Tuple[ShardMetadata, torch.Tensor]], group: dist.ProcessGroup,
                          device: torch.device, dtype: torch.dtype) -> ShardedTensor:
    """The [rows, dim] table as a ShardedTensor over this rank's (shard, weight) pairs `local` (none: a table with no
    shard here, TorchRec's empty ShardedTensor); one global shard per plan shard, in the plan's order. The local
    tensors are the given ones (no copy, no communication)."""
    where = _plan_positions(table, shards, [shard for shard, _ in local])
    rank, ranks = dist.get_rank(group), global_ranks(group)
    here = local[0][1].device if local else device
    metadata = [_torch_metadata(s.shard_offsets, s.shard_sizes, _placed(s, here, rank, ranks)) for s in shards]
    properties = _properties(local[0][1]) if local else TensorProperties(dtype=dtype, requires_grad=False)
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        [Shard(w, metadata[i]) for (_, w), i in zip(local, where)],
        ShardedTensorMetadata(shards_metadata=metadata, size=torch.Size([rows, dim]), tensor_properties=properties),
        process_group=group)


def table_sharded_tensors(table: str, rows: int, dim: int, shards: Sequence[ShardMetadata],
                          local: Sequence[Tuple[ShardMetadata, torch.Tensor, Mapping[str, torch.Tensor]]],
                          group: dist.ProcessGroup, local_world_size: int
                          ) -> Tuple[ShardedTensor, Dict[str, ShardedTensor]]:
    """The table's weight and each of its states (named as TorchRec names them, "<table>.momentum1", ...) as
    ShardedTensors over `local`: this rank's (shard, weight, state) in the table's own order (at least one).
    `shards`: all the table's shards (the plan's, every rank's, in its order)."""
    where = _plan_positions(table, shards, [shard for shard, _, _ in local])
    first = local[0][1]
    weight = weight_sharded_tensor(table, rows, dim, shards, [(shard, w) for shard, w, _ in local], group,
                                   first.device, first.dtype)
    rank, ranks = dist.get_rank(group), global_ranks(group)
    states: Dict[str, ShardedTensor] = {}
    names = list(local[0][2]) if local else []
    for name in names:
        values = [state[name] for _, _, state in local]
        layout, position = _state_layout(name, values[0], shards, rows, dim, local[0][0], local_world_size, rank,
                                         ranks)
        local_shards = [Shard(v, layout.shards_metadata[position[i]]) for v, i in zip(values, where)]
        states[name] = ShardedTensor._init_from_local_shards_and_global_metadata(local_shards, layout,
                                                                                process_group=group)
    return weight, states


def copy_into_sharded(target: ShardedTensor, saved, where: str) -> None:
    """Load `saved` into `target`'s local shards in place: a ShardedTensor whose local shards sit where `target`'s
    do (TorchRec's fused optimizer state of the same plan), a tensor of the global shape (each shard takes its
    slice), or, for a tensor of one local shard, that shard's tensor (rectoolkit's earlier per-rank state)."""
    mine = target.local_shards()
    if isinstance(saved, ShardedTensor):
        theirs = {(tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)): s.tensor
                  for s in saved.local_shards()}
        wanted = [(tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)) for s in mine]
        missing = [w for w in wanted if w not in theirs]
        size, target_size = list(saved.metadata().size), list(target.metadata().size)  # (.size() warns)
        if missing or size != target_size:
            raise ValueError(
                f"optimizer state {where}: the saved ShardedTensor (size {size}, local shards at "
                f"{sorted(theirs)}) does not hold this rank's shards {wanted} of size {target_size}: it was "
                "saved under another plan. Load it through torch.distributed.checkpoint (dcp.load into this "
                "optimizer's state_dict), which reshards")
        with torch.no_grad():
            for shard, key in zip(mine, wanted):
                shard.tensor.copy_(theirs[key])
        return
    saved = torch.as_tensor(saved)
    target_size = list(target.metadata().size)
    with torch.no_grad():
        if list(saved.shape) == target_size:
            for shard in mine:
                index = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets,
                                                                shard.metadata.shard_sizes))
                shard.tensor.copy_(saved[index])
        elif len(mine) == 1 and saved.shape == mine[0].tensor.shape:
            mine[0].tensor.copy_(saved)
        else:
            raise ValueError(f"optimizer state {where}: a tensor of shape {list(saved.shape)} fits neither the whole "
                             f"state {target_size} nor this rank's shards "
                             f"{[list(s.tensor.shape) for s in mine]}")


def row_block_sharded_tensor(tensor: torch.Tensor, start: int, blocks: Sequence[Tuple[int, int, int]],
                             group: dist.ProcessGroup) -> ShardedTensor:
    """`tensor`, this rank's row block at row `start`, as a ShardedTensor of all the blocks: (start, rows, rank)
    each, stacked along dim 0 (a row-wise managed-collision table's per-row state, as TorchRec's)."""
    rest, ranks, here = list(tensor.shape[1:]), global_ranks(group), dist.get_rank(group)
    metadata = [_torch_metadata([first] + [0] * len(rest), [rows] + rest, f"rank:{ranks[rank]}/{tensor.device}")
                for first, rows, rank in blocks]
    mine = [m for m, (first, _, rank) in zip(metadata, blocks) if first == start and rank == here]
    layout = ShardedTensorMetadata(shards_metadata=metadata, size=torch.Size([sum(b[1] for b in blocks)] + rest),
                                   tensor_properties=_properties(tensor))
    return ShardedTensor._init_from_local_shards_and_global_metadata([Shard(tensor, mine[0])], layout,
                                                                    process_group=group)


def local_rows(saved, start: int, rows: int, where: str):
    """This rank's row block [start, start + rows) of a saved row-block state: a ShardedTensor's local shard at
    `start`, or the rows of a whole tensor; a tensor of the block's own size is returned as it is (a state_dict of
    this rank's block)."""
    if isinstance(saved, ShardedTensor):
        for shard in saved.local_shards():
            if shard.metadata.shard_offsets[0] == start and shard.metadata.shard_sizes[0] == rows:
                return shard.tensor
        raise ValueError(f"{where}: the saved ShardedTensor's local shards "
                         f"{[(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in saved.local_shards()]} do not "
                         f"hold this rank's rows [{start}, {start + rows}): it was saved under another plan; load it "
                         "through torch.distributed.checkpoint, which reshards")
    if isinstance(saved, torch.Tensor) and saved.dim() > 0 and saved.shape[0] > rows:
        return saved[start:start + rows]
    return saved
