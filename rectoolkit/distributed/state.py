"""Global (unsharded) tensors of a sharded collection: gather a table from its shards, or load one into them.

Gathering is a collective over the collection's ranks (every rank calls it, in the same order); it moves each
shard once, from its owner, with broadcasts, so the bits are exactly the shard's bits. Loading copies this rank's
slices and sends nothing.

A collection's state_dict() gathers its tables, so it first meets the other ranks on a gloo group of its own
(`join_gather`; a collection on every rank of the world, the usual case; one on a group of part of the world
gathers straight away): a rank that calls it alone (TorchRec's state_dict needs no other rank, so ported code may do
`if rank == 0: torch.save(model.state_dict(), ...)`) warns after WARN_AFTER_S naming what is wrong instead of
waiting in silence, a rank that left ends it with an error at once, and ranks saving different collections at
the same time raise before any table moves (their broadcasts would pair up with each other's).

    >>> import rectoolkit as rtk
    >>> from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                                           feature_names=["f"])])
    >>> plan = {"t": rtk.ParameterSharding("row_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])}
    >>> sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    >>> torch.equal(gather_table(sharded, "t"), ebc.embedding_bags["t"].weight)
    True
"""

from __future__ import annotations

import hashlib
import time
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

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
def load_table(collection, table: str, full: torch.Tensor, local: Optional[Dict] = None) -> None:
    """Copy this rank's slices of a global [rows, dim] tensor into its shards (no communication)."""
    config = _config(collection, table)
    if tuple(full.shape) != (config.num_embeddings, config.embedding_dim):
        raise ValueError(f"table {table!r}: got a tensor of shape {tuple(full.shape)}, the table is "
                         f"{config.num_embeddings} x {config.embedding_dim}")
    local = _local_index(collection) if local is None else local
    for (name, r0, c0), weight in local.items():
        if name == table:
            weight.copy_(full[r0:r0 + weight.shape[0], c0:c0 + weight.shape[1]])


def collection_state_prefix(collection) -> str:
    """'embedding_bags.' for bag collections, 'embeddings.' for sequence ones (the unsharded modules' names)."""
    return "embedding_bags." if hasattr(collection, "embedding_bag_configs") else "embeddings."


def gather_group(env, create: bool = False) -> Optional["dist.ProcessGroup"]:
    """The gloo group of every rank that state_dict() meets on before gathering (None for one rank, and for a
    collection on a group of part of the world: torch names a group made by part of the world after its ranks, one
    such group per set of ranks, which the group's own code may need; those gather without meeting first).
    `create=True` makes it if there is none yet: a collective of every rank, so only where they all run it (sharding
    a collection)."""
    if env.world_size == 1 or not dist.is_initialized() or env.world_size != dist.get_world_size():
        return None
    world = dist.group.WORLD  # (a world destroyed and made again has a WORLD of its own)
    if world not in _GATHER_GROUPS and create:
        _GATHER_GROUPS[world] = dist.new_group(backend="gloo")
    return _GATHER_GROUPS.get(world)


def _tables_digest(collection) -> int:
    """A number every rank computes alike from the collection's tables and their placement."""
    text = repr([(type(collection).__name__, c.name, c.num_embeddings, c.embedding_dim,
                  str(collection.module_plan[c.name].sharding_type),
                  [(s.rank, s.rows, s.columns) for s in collection.module_plan[c.name].shards])
                 for c in collection.embedding_configs()])
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "little", signed=True)


def needs_gather(collection) -> bool:
    """Whether the collection's state_dict moves anything between ranks (a DATA_PARALLEL table is on every rank)."""
    return collection.env.world_size > 1 and any(
        ShardingType.parse(ps.sharding_type) != ShardingType.DATA_PARALLEL for ps in collection.module_plan.values())


def join_gather(collection, group: "dist.ProcessGroup", what: str = "state_dict()") -> None:
    """Wait until every rank of `group` has started gathering the same collection's tables; warn once after
    WARN_AFTER_S (naming the call and the fix) and keep waiting; raise at once if a rank left (its connection
    closed) or gathers another collection."""
    env = collection.env
    name = f"{type(collection).__name__}.{what} on rank {env.rank}"
    digest = _tables_digest(collection)
    every = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    work = dist.all_gather(every, torch.tensor([digest], dtype=torch.int64), group=group, async_op=True)
    started, pause, warned = time.monotonic(), 0.0002, False
    while not work.is_completed():
        if not warned and time.monotonic() - started > WARN_AFTER_S:
            warnings.warn(f"{name} has waited {WARN_AFTER_S:.0f} s for the other ranks of its group: it gathers whole "
                          f"tables from every rank (a collective), so every rank must call it, in the same order. "
                          f"TorchRec's state_dict() gives each rank's shards and needs no other rank; here call it on "
                          f"every rank (e.g. before `if rank == 0: torch.save(...)`). Still waiting.",
                          RuntimeWarning, stacklevel=2)
            warned = True
        time.sleep(pause)
        pause = min(2 * pause, 0.02)
    try:
        work.wait()
    except RuntimeError as error:
        raise RuntimeError(f"{name}: another rank of its group left or failed before the tables were gathered "
                           f"({error}); state_dict() is a collective: every rank must call it") from error
    others = [rank for rank, value in enumerate(every) if int(value) != digest]
    if others:
        raise ValueError(f"{name}: rank(s) {others} are gathering another collection's tables at the same time (their "
                         f"tables or placement differ): call state_dict() on the same modules, in the same order, "
                         f"on every rank")

