"""measure_plans (and pick_measured_fastest): every plan and rank measured; bytes and memory equal to independent counts; bad input refused.

The multi-process test runs 5 plans (table-wise on one rank, row-wise, column-wise, data-parallel, table-row-wise)
of 3 tiny tables on 2 gloo ranks for a few steps. Expected bytes come from rectoolkit.plan.traffic on the very
batch the counting step ran (and, for the table-wise plan, from a hand count over that batch); expected memory
from the shard shapes (fp32 weights, SGD keeps no state). Times are only checked to exist, never compared.
"""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest

import rectoolkit as rtk
from rectoolkit.launch.affinity import available_cpus
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.planner import Topology, measure_plans, pick_measured_fastest
from rectoolkit.planner import measure as measure_module
from rectoolkit.train.data import SyntheticData

W, BATCH = 2, 16
CORES = (available_cpus() * W)[:W]  # each rank bound to one core it may use (the same one when there is only one)
TABLES = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=40, embedding_dim=8, feature_names=["f0"]),
          rtk.EmbeddingBagConfig(name="t1", num_embeddings=30, embedding_dim=16, feature_names=["f1", "f2"]),
          rtk.EmbeddingBagConfig(name="t2", num_embeddings=10, embedding_dim=4, feature_names=["f3"])]
FACTORS = {"f0": 2.0, "f1": 3.0, "f2": 1.0, "f3": 4.0}


def on(rank, row, col, rows, cols):
    return ShardMetadata.on_rank(rank, row, col, rows, cols)


def ps(kind, shards, kernel="fused"):
    return ParameterSharding(kind, kernel, ranks=sorted({s.rank for s in shards}), shards=shards)


def plans():
    return {
        "table_wise_rank1": {t.name: ps("table_wise", [on(1, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in TABLES},
        "row_wise": {t.name: ps("row_wise", [on(r, r * (t.num_embeddings // 2), 0, t.num_embeddings // 2, t.embedding_dim)
                                             for r in range(W)]) for t in TABLES},
        "column_wise": {t.name: ps("column_wise", [on(r, 0, r * t.embedding_dim // 2, t.num_embeddings,
                                                      t.embedding_dim // 2) for r in range(W)]) for t in TABLES},
        "data_parallel": {t.name: ps("data_parallel", [on(r, 0, 0, t.num_embeddings, t.embedding_dim) for r in range(W)],
                                     "dense") for t in TABLES},
        "mixed": {"t0": ps("table_row_wise", [on(r, r * 20, 0, 20, 8) for r in range(W)]),
                  "t1": ps("table_wise", [on(0, 0, 0, 30, 16)]),
                  "t2": ps("data_parallel", [on(r, 0, 0, 10, 4) for r in range(W)], "dense")},
    }


def shard_bytes_on(plan, rank):
    """fp32 weights of the shards on `rank`, from the shard shapes."""
    return sum(4 * s.shard_sizes[0] * s.shard_sizes[1] for p in plan.values() for s in p.shards if s.rank == rank)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_measure_plans_bytes_memory_and_frames():
    the_plans = plans()
    picked, result = pick_measured_fastest(
        the_plans, TABLES, W, steps=2, warmup=2, rounds=2, phase_steps=1, batch_size=BATCH, pooling_factors=FACTORS,
        zipf_alpha=1.05, seed=3, num_batches=2, topology=Topology(world_size=W, compute_device="cpu"), timeout_s=540,
        cpu_binding=[[core] for core in CORES])  # bytes and memory do not depend on where the ranks run
    names = list(the_plans)
    # measure-in-the-loop returns the plan whose slowest-rank step time (median over steps) is lowest
    per_step = result.steps.groupby(["plan", "step"]).wall_ms.max().groupby("plan").median()
    assert picked == ShardingPlan({"": the_plans[per_step.idxmin()]})
    assert list(result.plans.plan) == names
    assert sorted(zip(result.ranks.plan, result.ranks["rank"])) == sorted((n, r) for n in names for r in range(W))
    # every timed step of every plan on every rank: 2 rounds x 2 steps; every phase once per round
    assert result.steps.groupby(["plan", "rank"]).size().to_dict() == {(n, r): 4 for n in names for r in range(W)}
    # phases: input_dist, lookup, output_dist per sharding-type group, the rest for the whole collection ("")
    groups = {n: sorted({ps.sharding_type for ps in plan.values()}) for n, plan in the_plans.items()}
    assert result.phases.groupby(["plan", "rank", "group", "phase"]).size().to_dict() == {
        **{(n, r, g, p): 2 for n in names for r in range(W) for g in groups[n] for p in measure_module.GROUP_PHASES},
        **{(n, r, "", p): 2 for n in names for r in range(W) for p in ("forward_other", "backward")}}
    assert (result.steps.wall_ms > 0).all() and (result.ranks.step_ms > 0).all()
    # bytes: measured by the instrumented collectives == traffic.py on the same batch, every rank pair
    priced = result.bytes[result.bytes.collective != "metadata"]
    mismatched = priced[priced.measured != priced.exact]
    assert mismatched.empty, mismatched
    assert result.plans.bytes_exact.all()
    # ... and a hand count for the table-wise plan: rank 0 sends rank 1 its lengths (int32) and ids (int64)
    batch0 = SyntheticData(TABLES, FACTORS, BATCH, dense_features=0, zipf_alpha=1.05, seed=3, rank=0,
                           world_size=W).batch(0).sparse_features
    ids0 = int(batch0.values().numel())
    sent = priced[(priced.plan == "table_wise_rank1") & (priced.collective == "input_dist") & (priced.src == 0)
                  & (priced.dst == 1)]
    assert int(sent.measured.iloc[0]) == 4 * BATCH * 4 + 8 * ids0  # 4 features
    back = priced[(priced.plan == "table_wise_rank1") & (priced.collective == "output_dist") & (priced.src == 1)
                  & (priced.dst == 0)]
    assert int(back.measured.iloc[0]) == 4 * BATCH * (8 + 16 + 16 + 4)
    # data-parallel: the all-reduce moves half of every gradient each way on 2 ranks (rows x cols x 4 bytes)
    dp = priced[(priced.plan == "data_parallel") & (priced.collective == "dp_allreduce") & (priced.src == 0)
                & (priced.dst == 1)]
    assert int(dp.measured.iloc[0]) == 4 * (40 * 8 + 30 * 16 + 10 * 4)
    # memory: measured == the shard shapes == the estimate, every rank (SGD: no optimizer state)
    for row in result.ranks.itertuples():
        expected = shard_bytes_on(the_plans[row.plan], row.rank)
        assert row.memory_weights_bytes == expected == row.est_memory_weights_bytes, row
        assert row.memory_optimizer_bytes == 0 == row.est_memory_optimizer_bytes, row
    assert result.plans.memory_exact.all()
    # the estimate sits beside the measurement; the plan's shape per rank is counted
    assert (result.ranks.est_time_ms >= 0).all()
    mixed = result.ranks[result.ranks.plan == "mixed"].set_index("rank")
    assert mixed.shards.to_dict() == {0: 3, 1: 2} and mixed.sharding_types.tolist() == [3, 3]
    # collective calls of one step: a table-wise group sends metadata, ids, pooled rows and their gradients;
    # a data-parallel one only all-reduces its gradients
    calls = result.ranks.set_index(["plan", "rank"]).calls_by_collective.map(json.loads)
    assert calls[("table_wise_rank1", 0)] == {"input_dist": 1, "metadata": 1, "output_dist": 1,
                                              "output_dist_backward": 1}
    assert calls[("data_parallel", 1)] == {"dp_allreduce": 1}
    assert result.info["world_size"] == W and len(result.info["load_average_before"]) == 3
    assert result.info["cpus"] == [[core] for core in CORES]
    # the load probed before the first timed step scales the quiet estimate: est_now_ms
    probe = result.info["load_probe_before"]
    assert probe["world_size"] == W and probe["steps"] >= 3 and probe["factor"] >= 1.0
    assert probe["median_ms"] >= probe["quiet_ms"] > 0
    share = result.plans.set_index("plan").est_load_share
    assert ((share > 0) & (share <= 1)).all()
    assert share["table_wise_rank1"] < 1.0 == share["row_wise"]  # rank 0 only waits / both ranks work alike
    assert probe["factor_alone"] is not None and probe["factor_alone"] > 0.5
    assert np.allclose(result.plans.est_now_ms, result.plans.est_step_ms * (
        probe["factor_alone"] + (probe["factor"] - probe["factor_alone"]) * result.plans.est_load_share))
    assert np.allclose(result.plans.measured_over_now, result.plans.step_ms / result.plans.est_now_ms)
    # ... and between the blocks: 4 synthetic steps after each of the 5 plans' blocks in each of the 2 rounds
    during = result.info["load_probe_during"]
    assert during["steps"] == 4 * len(names) * 2 and during["factor"] >= 1.0
    assert np.allclose(result.plans.est_during_ms, result.plans.est_step_ms * (
        during["factor_alone"] + (during["factor"] - during["factor_alone"]) * result.plans.est_load_share))
    record = result.to_dict()
    assert set(record) == {"info", "plans", "ranks", "steps", "phases", "bytes"}


def test_estimate_plan_is_the_cost_model_per_rank():
    from rectoolkit.planner.cost import CostModel
    from rectoolkit.planner.stats import WorkloadStats
    from rectoolkit.planner.tables import collect_tables

    topology = Topology(world_size=W, compute_device="cpu")
    tables = collect_tables(TABLES, BATCH, stats=WorkloadStats(pooling_factors=FACTORS))
    plan = ShardingPlan({"": plans()["mixed"]})
    est = measure_module.estimate_plan(CostModel(topology, "sgd"), plan, tables)
    assert est["est_time_ms"].shape == (W,)
    assert est["est_memory_weights_bytes"].tolist() == [shard_bytes_on(plans()["mixed"], r) for r in range(W)]


def test_docstring_examples():
    result = doctest.testmod(measure_module)
    assert result.failed == 0, result


def test_pick_measured_fastest_refuses_an_unknown_column_before_running():
    with pytest.raises(ValueError, match=r"by='fastest' is not a measured step column; use one of \['step_ms'"):
        pick_measured_fastest({"row_wise": plans()["row_wise"]}, TABLES, W, by="fastest")


@pytest.mark.parametrize("change, error, words", [
    (dict(plans=ShardingPlan({"": plans()["row_wise"]})), TypeError, "not one plan"),
    (dict(plans={}), ValueError, "no plans"),
    (dict(plans={"x": "row_wise"}), TypeError, "plan 'x' is a str"),
    (dict(plans={"bad": {"t0": plans()["row_wise"]["t0"]}}), ValueError, "no entry for ['t1', 't2']"),
    (dict(plans={"far": {**plans()["row_wise"], "t2": ps("table_wise", [on(2, 0, 0, 10, 4)])}}), ValueError,
     "shard 0 is placed on rank 2"),
    (dict(plans={"gap": {**plans()["row_wise"], "t2": ps("row_wise", [on(0, 0, 0, 4, 4), on(1, 5, 0, 5, 4)])}}),
     ValueError, "t2"),
    (dict(plans={"two": ShardingPlan({"a": plans()["row_wise"], "b": plans()["row_wise"]})}), ValueError,
     "modules ['a', 'b']"),
    (dict(tables=[]), ValueError, "non-empty list"),
    (dict(tables=[rtk.EmbeddingConfig(name="t0", num_embeddings=4, embedding_dim=4, feature_names=["f0"])]),
     TypeError, "EmbeddingConfig"),
    (dict(tables=TABLES + [TABLES[0]]), ValueError, "'t0' appears twice"),
    (dict(pooling_factors={"nope": 2.0}), ValueError, "['nope']"),
    (dict(pooling_factors={"f0": 0}), ValueError, "pooling factor of 'f0'"),
    (dict(steps=0), ValueError, "steps must be an int >= 1, got 0"),
    (dict(batch_size=2.5), ValueError, "batch_size"),
    (dict(phase_steps=-1), ValueError, "phase_steps must be an int >= 0"),
    (dict(world_size=0), ValueError, "world_size"),
    (dict(zipf_alpha=-1.0), ValueError, "zipf_alpha"),
    (dict(optimizer="nesterov"), ValueError, "nesterov"),
    (dict(topology=Topology(world_size=4, compute_device="cpu")), ValueError, "world_size 4"),
    (dict(topology=Topology(world_size=2, compute_device="cuda")), ValueError, "compute_device='cpu'"),
])
def test_bad_input_is_refused_before_any_worker_starts(change, error, words):
    args = dict(plans={"row_wise": plans()["row_wise"]}, tables=TABLES, world_size=W, pooling_factors=FACTORS)
    args.update(change)
    with pytest.raises(error) as raised:
        measure_plans(args.pop("plans"), args.pop("tables"), args.pop("world_size"), **args)
    assert words in str(raised.value), str(raised.value)
