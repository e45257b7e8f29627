"""Hand edits of a plan (what a drag on the explorer's placement board does), as pure functions on plan objects.

    >>> from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
    >>> plan = ShardingPlan({"": {"t": ParameterSharding("table_wise", ranks=[0],
    ...                                                   shards=[ShardMetadata.on_rank(0, 0, 0, 10, 4)])}})
    >>> moved = move_shard(plan, "t", 0, rank=1, local_world_size=2)
    >>> moved.plan[""]["t"].ranks, moved.plan[""]["t"].shards[0].placement, plan.plan[""]["t"].ranks
    ([1], 'rank:1/cpu', [0])
"""

from __future__ import annotations

import copy
from typing import Optional

from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardingType, ShardMetadata
from rectoolkit.plan.validation import validate_plan

ANY_RANK = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)
ONE_BLOCK_PER_RANK = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD)
ONE_HOST = {ShardingType.TABLE_ROW_WISE: "row", ShardingType.GRID_SHARD: "row", ShardingType.TABLE_COLUMN_WISE: "column"}


class MoveError(ValueError):
    """A shard cannot go where it was dropped; the message says why and what works instead."""


def movable(ps: ParameterSharding) -> bool:
    """Whether shards of this table can be moved by hand (replicas of DATA_PARALLEL tables cannot)."""
    return ps.type != ShardingType.DATA_PARALLEL


def check_move(ps: ParameterSharding, table: str, shard_index: int, rank: int, world_size: int,
               local_world_size: Optional[int] = None) -> None:
    """Raise MoveError if shard `shard_index` of `table` cannot be placed on `rank`."""
    if not 0 <= shard_index < len(ps.shards):
        raise MoveError(f"table {table!r} has {len(ps.shards)} shards; there is no shard {shard_index}")
    if not 0 <= rank < world_size:
        raise MoveError(f"rank {rank} does not exist: ranks are 0..{world_size - 1}")
    kind = ps.type
    shard = ps.shards[shard_index]
    if kind == ShardingType.DATA_PARALLEL:
        raise MoveError(f"table {table!r} is DATA_PARALLEL: it has a replica on every rank, nothing to move; "
                        "force another sharding type for it first")
    if kind in ONE_BLOCK_PER_RANK:
        others = [s.rank for i, s in enumerate(ps.shards) if i != shard_index and s.columns == shard.columns]
        if rank in others:
            raise MoveError(f"rank {rank} already holds a row block of {table!r} columns {shard.columns}; "
                            f"{kind.value} keeps one row block per rank (swap instead: move that block away first)")
    if kind in ONE_HOST and local_world_size:
        if rank // local_world_size != shard.rank // local_world_size:
            raise MoveError(f"{kind.value} keeps the {ONE_HOST[kind]} blocks of {table!r} inside host "
                            f"{shard.rank // local_world_size} (ranks {shard.rank // local_world_size * local_world_size}.."
                            f"{(shard.rank // local_world_size + 1) * local_world_size - 1}); rank {rank} is on another host")


def move_shard(plan: ShardingPlan, table: str, shard_index: int, rank: int,
               world_size: Optional[int] = None, local_world_size: Optional[int] = None,
               module_path: Optional[str] = None) -> ShardingPlan:
    """A copy of `plan` with one shard of `table` placed on `rank` (the input plan is not changed)."""
    path = module_path if module_path is not None else _module_of(plan, table)
    ps = plan.plan[path][table]
    if world_size is None:
        world_size = max(plan.ranks_used() + [rank]) + 1
    check_move(ps, table, shard_index, rank, world_size, local_world_size)
    new_plan = copy.deepcopy(plan)
    new_ps = new_plan.plan[path][table]
    old = new_ps.shards[shard_index]
    device = old.device.split(":")[0]
    new_ps.shards[shard_index] = ShardMetadata.on_rank(rank, old.shard_offsets[0], old.shard_offsets[1],
                                                       old.shard_sizes[0], old.shard_sizes[1], device=device)
    new_ps.ranks = [s.rank for s in new_ps.shards]
    validate_plan(new_plan, world_size=world_size, source=f"the plan after moving shard {shard_index} of {table!r}")
    return new_plan


def _module_of(plan: ShardingPlan, table: str) -> str:
    for path, name, _ in plan.items():
        if name == table:
            return path
    raise MoveError(f"the plan has no table {table!r}; it has {[name for _, name, _ in plan.items()]}")
