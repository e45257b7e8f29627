"""A sharded collection's tables in a state_dict: this rank's shards as a ShardedTensor, or the whole table.

    table_state(collection, table)        what the collection's state_dict() holds for the table (TorchRec's):
                                          a ShardedTensor of this rank's shards, no communication
    full_state_dict(module)               module.state_dict() with every ShardedTensor gathered whole (a collective)
    load_table(collection, table, saved)  copy this rank's slices of a whole table, or its local shards of a
                                          ShardedTensor saved under the same plan, into its shards (no communication)

As in TorchRec, `state_dict()` of a sharded collection or a DistributedModelParallel gives each sharded table as a
torch ShardedTensor (`.local_shards()`: this rank's blocks, views of the live weights; `.metadata()`: every rank's),
a DATA_PARALLEL table as its replica, and needs no other rank, so `if rank == 0: torch.save(model.state_dict(), ...)`
is fine, and torch.distributed.checkpoint saves each rank's shards and reshards on load. A collection on a group of
part of the world (a 2D layout's sharding group) places its shards by global rank, as torch's ShardedTensor does.
Where there is no ShardedTensor to make (one process without torch.distributed, or ranks held in one process) the
state_dict holds whole tables.

`full_state_dict` gathers every ShardedTensor into a whole tensor on every rank (its owner broadcasts each shard, so
the bits are exactly the shard's bits): the unsharded model's state, loadable into a model of any plan, or none. It
is a collective, so the ranks first meet on a gloo group of their own (made when the collections are sharded): a
rank that calls it alone warns after WARN_AFTER_S naming what is wrong instead of waiting in silence, a rank that
left ends it with an error at once, and ranks gathering different tables at the same time raise before any table
moves (their broadcasts would pair up with each other's).

    >>> import rectoolkit as rtk
    >>> from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                                           feature_names=["f"])])
    >>> plan = {"t": rtk.ParameterSharding("row_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])}
    >>> sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    >>> torch.equal(full_state_dict(sharded)["embedding_bags.t.weight"], ebc.embedding_bags["t"].weight)
    True
"""

from __future__ import annotations

import hashlib
import sys
import time
import warnings
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.modules.mixed_dtypes import table_dtype
from rectoolkit.plan.types import ShardingType


WARN_AFTER_S = 10.0  # a rank that waits this long for the others to start gathering says so
_GATHER_GROUPS: Dict[object, "dist.ProcessGroup"] = {}  # the world (its WORLD group) -> its gloo gather group


def _local_index(collection) -> Dict[Tuple[str, int, int], torch.Tensor]:
    """(table, row offset, column offset) -> this rank's weight tensor of that shard."""
    return {(table, *shard.shard_offsets): weight for table, shard, weight, _ in collection.local_shards()}


def _config(collection, table: str):
    for config in collection.embedding_configs():
        if config.name == table:
            return config
    raise KeyError(f"the sharded collection has no table {table!r}; it has "
                   f"{[c.name for c in collection.embedding_configs()]}")


@torch.no_grad()
def gather_table(collection, table: str, local: Optional[Dict] = None) -> torch.Tensor:
    """The whole [rows, dim] table on every rank, assembled from its shards (collective)."""
    env = collection.env
    config = _config(collection, table)
    local = _local_index(collection) if local is None else local
    ps = collection.module_plan[table]
    if ShardingType.parse(ps.sharding_type) == ShardingType.DATA_PARALLEL:
        return local[(table, 0, 0)].detach().clone()
    full = torch.empty(config.num_embeddings, config.embedding_dim, dtype=table_dtype(config.data_type),
                       device=env.device)
    for shard in ps.shards:
        (r0, r1), (c0, c1) = shard.rows, shard.columns
        if shard.rank == env.rank:
            buffer = local[(table, r0, c0)].detach().to(full.dtype).contiguous()
        else:
            buffer = torch.empty(r1 - r0, c1 - c0, dtype=full.dtype, device=env.device)
        if env.world_size > 1:
            dist.broadcast(buffer, group=env.pg, group_src=shard.rank)  # (a rank of env.pg)
        full[r0:r1, c0:c1] = buffer
    return full


@torch.no_grad()
def table_state(collection, table: str, keep_vars: bool = False) -> torch.Tensor:
    """The table in the collection's state_dict (module docstring): a ShardedTensor of this rank's shards (their
    weights themselves with `keep_vars`, else detached views), a DATA_PARALLEL table's replica, or, where the
    collection has no ShardedTensor group, the whole table gathered (a collective)."""
    env = collection.env
    config = _config(collection, table)
    local = [(shard, weight) for name, shard, weight, _ in collection.local_shards() if name == table]
    ps = collection.module_plan[table]
    if ShardingType.parse(ps.sharding_type) == ShardingType.DATA_PARALLEL:
        return local[0][1] if keep_vars else local[0][1].detach()
    # (torch's ShardedTensor module costs 70 ms to import: loaded when first needed)
    from rectoolkit.distributed.sharded_state import sharded_tensor_group, weight_sharded_tensor

    group = sharded_tensor_group(env)
    if group is None:
        return gather_table(collection, table)
    return weight_sharded_tensor(table, config.num_embeddings, config.embedding_dim, ps.shards,
                                 [(shard, weight if keep_vars else weight.detach()) for shard, weight in local],
                                 group, env.device, table_dtype(config.data_type))


def is_sharded_tensor(value) -> bool:
    """Whether `value` is a torch ShardedTensor (without importing torch's module for it: none exists before)."""
    module = sys.modules.get("torch.distributed._shard.sharded_tensor")
    return module is not None and isinstance(value, module.ShardedTensor)


@torch.no_grad()
def load_table(collection, table: str, saved: torch.Tensor, local: Optional[Dict] = None) -> None:
    """Copy this rank's slices of `saved` into its shards (no communication): a whole [rows, dim] tensor (each shard
    takes its slice), or a ShardedTensor whose local shards are this rank's shards (saved under the same plan)."""
    config = _config(collection, table)
    local = _local_index(collection) if local is None else local
    mine = {(r0, c0): weight for (name, r0, c0), weight in local.items() if name == table}
    if is_sharded_tensor(saved):
        size = list(saved.metadata().size)  # (.size() warns)
        theirs = {tuple(s.metadata.shard_offsets): s.tensor for s in saved.local_shards()}
        held = {offsets: list(weight.shape) for offsets, weight in mine.items()}
        if size != [config.num_embeddings, config.embedding_dim] or any(
                offsets not in theirs or list(theirs[offsets].shape) != shape for offsets, shape in held.items()):
            raise ValueError(
                f"table {table!r}: the saved ShardedTensor (size {size}, this rank's shards at (row, column) "
                f"{sorted(theirs)}) does not hold this rank's shards {sorted(held)} of the "
                f"{config.num_embeddings} x {config.embedding_dim} table: it was saved under another plan. Save "
                "whole tables (rectoolkit.distributed.full_state_dict) to load them under any plan, or load through "
                "torch.distributed.checkpoint (dcp.load into this model's state_dict), which reshards")
        for offsets, weight in mine.items():
            weight.copy_(theirs[offsets])
        return
    full = torch.as_tensor(saved)
    if tuple(full.shape) != (config.num_embeddings, config.embedding_dim):
        raise ValueError(f"table {table!r}: got a tensor of shape {tuple(full.shape)}, the table is "
                         f"{config.num_embeddings} x {config.embedding_dim}")
    for (r0, c0), weight in mine.items():
        weight.copy_(full[r0:r0 + weight.shape[0], c0:c0 + weight.shape[1]])


def _device_here(placed: torch.device) -> torch.device:
    """This rank's device of the kind a shard is placed on (another rank's "cuda:3" is this rank's current GPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if placed.type == "cuda" else placed


@torch.no_grad()
def gather_sharded_tensor(value) -> torch.Tensor:
    """A ShardedTensor's whole tensor on every rank of its group (collective): each shard broadcast by its owner,
    on the device kind its placement names (NCCL moves GPU shards, gloo CPU ones)."""
    metadata = value.metadata()
    group = value._process_group
    rank = dist.get_rank()
    mine = {tuple(s.metadata.shard_offsets): s.tensor for s in value.local_shards()}
    dtype = metadata.tensor_properties.dtype
    device = next(iter(mine.values())).device if mine else \
        _device_here(metadata.shards_metadata[0].placement.device())
    full = torch.empty(list(metadata.size), dtype=dtype, device=device)
    for shard in metadata.shards_metadata:
        owner = shard.placement.rank()
        if owner == rank:
            buffer = mine[tuple(shard.shard_offsets)].detach().to(dtype=dtype).contiguous()
        else:
            buffer = torch.empty(shard.shard_sizes, dtype=dtype, device=_device_here(shard.placement.device()))
        dist.broadcast(buffer, src=owner, group=group)  # (src: a global rank, as placements name them)
        full[tuple(slice(o, o + n) for o, n in zip(shard.shard_offsets, shard.shard_sizes))] = buffer
    return full


def full_state_dict(module: nn.Module) -> Dict[str, torch.Tensor]:
    """`module.state_dict()` with every ShardedTensor gathered into the whole tensor on every rank: the unsharded
    model's state, which loads into a model of any plan (a collective: every rank calls it, in the same order)."""
    state = module.state_dict()
    sharded = [(key, value) for key, value in state.items() if is_sharded_tensor(value)]
    if not sharded:
        return state
    group = _GATHER_GROUPS.get(dist.group.WORLD)
    # (the ranks meet on the world's group over the tables every rank holds: those on groups of part of the world,
    # a 2D layout's, differ from group to group)
    everywhere = [(key, value) for key, value in sharded
                  if dist.get_world_size(value._process_group) == dist.get_world_size()]
    if group is not None and everywhere:
        layout = repr([(key, list(value.metadata().size),
                        [(s.shard_offsets, s.shard_sizes, s.placement.rank()) for s in value.metadata().shards_metadata])
                       for key, value in everywhere])
        join_gather(group, int.from_bytes(hashlib.sha1(layout.encode()).digest()[:8], "little", signed=True),
                    f"full_state_dict({type(module).__name__}) on rank {dist.get_rank()}")
    for key, value in sharded:
        state[key] = gather_sharded_tensor(value)
    return state


def collection_state_prefix(collection) -> str:
    """'embedding_bags.' for bag collections, 'embeddings.' for sequence ones (the unsharded modules' names)."""
    return "embedding_bags." if hasattr(collection, "embedding_bag_configs") else "embeddings."


def gather_group(env, create: bool = False) -> Optional["dist.ProcessGroup"]:
    """The gloo group of every rank that full_state_dict() meets on before gathering (None for one rank, and for a
    collection on a group of part of the world: torch names a group made by part of the world after its ranks, one
    such group per set of ranks, which the group's own code may need; and its state_dict has no ShardedTensors).
    `create=True` makes it if there is none yet: a collective of every rank, so only where they all run it (sharding
    a collection)."""
    if env.world_size == 1 or not dist.is_initialized() or env.world_size != dist.get_world_size():
        return None
    world = dist.group.WORLD  # (a world destroyed and made again has a WORLD of its own)
    if world not in _GATHER_GROUPS and create:
        _GATHER_GROUPS[world] = dist.new_group(backend="gloo")
    return _GATHER_GROUPS.get(world)


def needs_gather(collection) -> bool:
    """Whether the collection's tables move between ranks to be whole (a DATA_PARALLEL table is on every rank)."""
    return collection.env.world_size > 1 and any(
        ShardingType.parse(ps.sharding_type) != ShardingType.DATA_PARALLEL for ps in collection.module_plan.values())


def join_gather(group: "dist.ProcessGroup", digest: int, name: str) -> None:
    """Wait until every rank of `group` has started gathering the same tables (`digest`: a number every rank
    computes alike from them); warn once after WARN_AFTER_S (naming the call `name` and the fix) and keep waiting;
    raise at once if a rank left (its connection closed) or gathers other tables."""
    every: List[torch.Tensor] = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(every, torch.tensor([digest], dtype=torch.int64), group=group, async_op=True)
    started, pause, warned = time.monotonic(), 0.0002, False
    while not work.is_completed():
        if not warned and time.monotonic() - started > WARN_AFTER_S:
            warnings.warn(f"{name} has waited {WARN_AFTER_S:.0f} s for the other ranks of its group: it gathers whole "
                          f"tables from every rank (a collective), so every rank must call it, in the same order "
                          f"(e.g. before `if rank == 0: torch.save(...)`). To save on one rank alone, save "
                          f"`model.state_dict()` (each rank's shards as ShardedTensors, no communication). Still "
                          f"waiting.", RuntimeWarning, stacklevel=3)
            warned = True
        time.sleep(pause)
        pause = min(2 * pause, 0.02)
    try:
        work.wait()
    except RuntimeError as error:
        raise RuntimeError(f"{name}: another rank of its group left or failed before the tables were gathered "
                           f"({error}); full_state_dict() is a collective: every rank must call it") from error
    others = [rank for rank, value in enumerate(every) if int(value) != digest]
    if others:
        raise ValueError(f"{name}: rank(s) {others} are gathering other tables at the same time (their names, sizes "
                         f"or placement differ): call full_state_dict() on the same modules, in the same order, on "
                         f"every rank")
