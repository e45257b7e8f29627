"""Plans are validated wherever they enter: DistributedModelParallel, the sharders, plan files, hand edits.

The tiling check is compared with a brute-force count of every cell over random shard layouts (hypothesis);
the entry points are each given the overlapping plan of issue 13 (two row shards both covering rows 0-5).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv, shard_embedding_bag_collection
from rectoolkit.distributed.agree import plan_fingerprint
from rectoolkit.plan import PlanValidationError, move_shard, plan_to_json, validate_module_plan, validate_plan
from rectoolkit.plan.serialization import load_plan
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata


def s(rank, offsets, sizes):
    return ShardMetadata.on_rank(rank, offsets[0], offsets[1], sizes[0], sizes[1])


def tables():
    return [rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0"]),
            rtk.EmbeddingBagConfig(name="t1", num_embeddings=6, embedding_dim=4, feature_names=["f1"])]


def overlapping():
    """Issue 13's case: rows 0-5 in two shards, rows 5-10 in none; as many cells as the table has."""
    return ParameterSharding("row_wise", ranks=[0, 1], shards=[s(0, [0, 0], [5, 4]), s(1, [0, 0], [5, 4])])


def good_t1():
    return ParameterSharding("table_wise", ranks=[0], shards=[s(0, [0, 0], [6, 4])])


OVERLAP = r"the shards of table (sparse\.)?t0 do not tile it exactly: overlap at rows 0..5 in columns 0..4"


# ------------------------------------------------------------------------------------------------ every entry point
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sparse = rtk.EmbeddingBagCollection(tables())


def test_dmp_refuses_an_overlapping_plan_object():
    with pytest.raises(PlanValidationError, match=OVERLAP):
        DistributedModelParallel(Model(), env=ShardingEnv.local(),
                                 plan=ShardingPlan({"sparse": {"t0": ParameterSharding(
                                     "row_wise", ranks=[0], shards=[s(0, [0, 0], [5, 4]), s(0, [0, 0], [5, 4])]),
                                     "t1": good_t1()}}))


def test_sharders_refuse_an_overlapping_plan():
    env = ShardingEnv(rank=0, world_size=2, local_world_size=2)  # construction needs no communication
    with pytest.raises(PlanValidationError, match=OVERLAP):
        shard_embedding_bag_collection(rtk.EmbeddingBagCollection(tables()), {"t0": overlapping(), "t1": good_t1()}, env)


def test_plan_files_refuse_an_overlapping_plan(tmp_path):
    file = tmp_path / "plan.json"
    file.write_text(plan_to_json(ShardingPlan({"": {"t0": overlapping(), "t1": good_t1()}})))
    with pytest.raises(PlanValidationError, match=OVERLAP):
        load_plan(file)


def test_edits_refuse_an_overlapping_plan():
    plan = ShardingPlan({"": {"t0": overlapping(), "t1": good_t1()}})
    with pytest.raises(PlanValidationError, match=OVERLAP):
        move_shard(plan, "t1", 0, rank=1, world_size=2)


def test_unknown_table_is_an_error_and_an_unknown_module_a_warning():
    plan = {"sparse": {"t0": ParameterSharding("table_wise", ranks=[0], shards=[s(0, [0, 0], [10, 4])]),
                       "t1": good_t1(), "t9": good_t1()}}
    with pytest.raises(PlanValidationError, match=r"unknown tables \['sparse.t9'\]"):
        DistributedModelParallel(Model(), env=ShardingEnv.local(), plan=ShardingPlan(plan))
    plan = {"sparse": dict(plan["sparse"]), "elsewhere": {"t1": good_t1()}}
    del plan["sparse"]["t9"]
    with pytest.warns(UserWarning, match=r"names module\(s\) \['elsewhere'\] where the model has no "
                                         r"embedding collection \(collections at \['sparse'\]\)"):  # TorchRec: silent
        dmp = DistributedModelParallel(Model(), env=ShardingEnv.local(), plan=ShardingPlan(plan))
    assert list(dmp.plan.plan) == ["sparse", "elsewhere"] and "sparse" in dmp._sharded
    with pytest.raises(PlanValidationError, match=r"unknown tables \['t9'\]"):
        shard_embedding_bag_collection(rtk.EmbeddingBagCollection(tables()),
                                       {"t0": plan["sparse"]["t0"], "t1": good_t1(), "t9": good_t1()}, ShardingEnv.local())


def test_every_table_must_be_planned():
    with pytest.raises(PlanValidationError, match=r"no entry for \['sparse.t1'\]"):
        DistributedModelParallel(Model(), env=ShardingEnv.local(), plan=ShardingPlan({"sparse": {
            "t0": ParameterSharding("table_wise", ranks=[0], shards=[s(0, [0, 0], [10, 4])])}}))


@pytest.mark.parametrize("ps,match", [
    (ParameterSharding("table_wise", ranks=[2], shards=[s(2, [0, 0], [10, 4])]),
     "table t0: shard 0 is placed on rank 2 but the world size is 2; re-plan for 2 ranks"),
    (ParameterSharding("table_wise", shards=[ShardMetadata([0, 0], [10, 4], "rank:-1/cpu")]),
     "shard 0 is placed on rank -1"),
    (ParameterSharding("table_wise", ranks=[1], shards=[s(0, [0, 0], [10, 4])]),
     r"table t0 lists ranks \[1\] but its shards are on ranks \[0\]"),
    (ParameterSharding("row_wise", ranks=[0, 1], shards=[s(0, [0, 0], [5, 4]), s(1, [6, 0], [4, 4])]),
     r"gap at rows 5..6 in columns 0..4"),
    (ParameterSharding("column_wise", ranks=[0, 1], shards=[s(0, [0, 0], [10, 3]), s(1, [0, 2], [10, 2])]),
     r"overlap at rows 0..10 in columns 2..3"),
    (ParameterSharding("data_parallel", ranks=[0, 0], shards=[s(0, [0, 0], [10, 4]), s(0, [0, 0], [10, 4])]),
     r"data_parallel table t0 has two replicas on one rank"),
])
def test_ranks_and_tiling(ps, match):
    with pytest.raises(PlanValidationError, match=match):
        validate_module_plan({"t0": ps, "t1": good_t1()}, tables(), world_size=2, owner="test")


# ------------------------------------------------------------------------------------------------ tiling, by brute force
def tiles_exactly(shards, rows, cols) -> bool:
    """Independent check: count how many shards cover each cell."""
    count = np.zeros((rows, cols), dtype=int)
    for (r0, c0), (nr, nc) in shards:
        if r0 + nr > rows or c0 + nc > cols:
            return False
        count[r0:r0 + nr, c0:c0 + nc] += 1
    return bool((count == 1).all())


@st.composite
def layouts(draw):
    """Rows x cols and shards: a true tiling (column strips cut into row blocks), then perhaps one shard nudged."""
    rows, cols = draw(st.integers(1, 7)), draw(st.integers(1, 6))
    col_cuts = sorted(set(draw(st.lists(st.integers(1, cols - 1), max_size=2)) if cols > 1 else []))
    shards = []
    for c0, c1 in zip([0] + col_cuts, col_cuts + [cols]):
        row_cuts = sorted(set(draw(st.lists(st.integers(0, rows), max_size=3))))
        for r0, r1 in zip([0] + row_cuts, row_cuts + [rows]):
            shards.append(((r0, c0), (r1 - r0, c1 - c0)))
    if draw(st.booleans()):
        k = draw(st.integers(0, len(shards) - 1))
        (r0, c0), (nr, nc) = shards[k]
        field = draw(st.integers(0, 3))
        delta = draw(st.sampled_from([-1, 1]))
        values = [r0, c0, nr, nc]
        values[field] = max(0, values[field] + delta)
        shards[k] = ((values[0], values[1]), (values[2], values[3]))
    return rows, cols, shards


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(0, 1000))
def test_tiling_check_agrees_with_a_cell_count(layout, seed):
    rows, cols, shards = layout
    order = np.random.default_rng(seed).permutation(len(shards))  # the order of the shards must not matter
    metas = [ShardMetadata.on_rank(i % 3, *shards[i][0], *shards[i][1]) for i in order]
    plan = ShardingPlan({"": {"t": ParameterSharding("row_wise", shards=metas)}})
    expected = tiles_exactly(shards, rows, cols)
    try:
        validate_plan(plan, {"t": (rows, cols)}, world_size=3)
        accepted = True
    except PlanValidationError:
        accepted = False
    assert accepted == expected, (rows, cols, shards)


# ------------------------------------------------------------------------------------------------ fingerprints
def test_fingerprint_ignores_order_and_sees_any_change():
    a = ShardingPlan({"m": {"t0": overlapping(), "t1": good_t1()}})
    b = ShardingPlan({"m": {"t1": good_t1(), "t0": overlapping()}})
    assert plan_fingerprint(a) == plan_fingerprint(b)
    moved = ShardingPlan({"m": {"t0": overlapping(), "t1": ParameterSharding("table_wise", ranks=[1],
                                                                             shards=[s(1, [0, 0], [6, 4])])}})
    assert plan_fingerprint(moved) != plan_fingerprint(a)
    renamed = ShardingPlan({"n": {"t0": overlapping(), "t1": good_t1()}})
    assert plan_fingerprint(renamed) != plan_fingerprint(a)
    assert len(plan_fingerprint(a)) == 32


@pytest.mark.torchrec
def test_torchrec_plans_are_validated_on_import():
    pytest.importorskip("torchrec")
    from rectoolkit.plan import from_torchrec, to_torchrec

    gap = ParameterSharding("row_wise", ranks=[0, 1], shards=[s(0, [0, 0], [5, 4]), s(1, [6, 0], [4, 4])])
    torchrec_plan = to_torchrec(ShardingPlan({"": {"t0": gap, "t1": good_t1()}}))  # TorchRec allows a gap
    with pytest.raises(PlanValidationError, match=r"the TorchRec plan: the shards of table t0 do not tile it "
                                                  r"exactly: gap at rows 5..6"):
        from_torchrec(torchrec_plan, tables())


@pytest.mark.parametrize("name", ["validation", "serialization", "edits", "types"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(f"rectoolkit.plan.{name}"))
    assert result.attempted > 0 and result.failed == 0, result
