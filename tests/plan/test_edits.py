"""Hand edits of a plan: moving a shard keeps the plan valid, leaves the input alone, and refuses bad moves."""

import pytest

from rectoolkit.plan import MoveError, ParameterSharding, ShardingPlan, ShardMetadata, move_shard, validate_plan


def plan():
    return ShardingPlan({"": {
        "tw": ParameterSharding("table_wise", ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, 10, 8)]),
        "rw": ParameterSharding("row_wise", ranks=[0, 1, 2, 3],
                                shards=[ShardMetadata.on_rank(r, 3 * r, 0, 3 if r < 3 else 1, 8) for r in range(4)]),
        "dp": ParameterSharding("data_parallel", "dense", ranks=[0, 1, 2, 3],
                                shards=[ShardMetadata.on_rank(r, 0, 0, 5, 4) for r in range(4)]),
    }})


def test_move_keeps_the_plan_valid_and_the_input_unchanged():
    original = plan()
    moved = move_shard(original, "tw", 0, rank=3, world_size=4)
    assert moved.plan[""]["tw"].ranks == [3] and moved.plan[""]["tw"].shards[0].rank == 3
    assert original.plan[""]["tw"].ranks == [0]
    validate_plan(moved, {"tw": (10, 8), "rw": (10, 8), "dp": (5, 4)}, world_size=4)
    # a row block may go to a rank holding no other block of the table
    swapped = move_shard(move_shard(original, "rw", 0, 4, world_size=5), "rw", 3, 0, world_size=5)
    assert [s.rank for s in swapped.plan[""]["rw"].shards] == [4, 1, 2, 0]


@pytest.mark.parametrize("table,shard,rank,message", [
    ("dp", 0, 1, "DATA_PARALLEL"),
    ("rw", 0, 1, "already holds a row block"),
    ("tw", 0, 4, "rank 4 does not exist"),
    ("tw", 1, 0, "there is no shard 1"),
    ("nope", 0, 0, "no table 'nope'"),
])
def test_bad_moves_say_why(table, shard, rank, message):
    with pytest.raises(MoveError, match=message):
        move_shard(plan(), table, shard, rank, world_size=4)
