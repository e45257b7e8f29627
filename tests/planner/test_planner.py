"""EmbeddingShardingPlanner end to end: inputs, every sharding type, errors, reports, explanations."""

import re

import numpy as np
import pandas as pd
import pytest
import torch

from rectoolkit.modules.configs import EmbeddingBagConfig, EmbeddingConfig
from rectoolkit.plan.serialization import validate_plan
from rectoolkit.plan.traffic import COLLECTIVES
from rectoolkit.plan.types import ShardingType
from rectoolkit.planner import (EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology,
                                WorkloadStats)

GIB = 1024 ** 3


def bag(name, rows, dim, features=None):
    return EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=features or [name + "_f"])


def squash(text):
    return [re.sub(r"\s+", " ", line).strip() for line in text.strip().splitlines() if line.strip()]


def test_seed_001_plan_prints_like_torchrec():
    """Seed 001: two 4096 x 64 tables on one GPU print as TorchRec's 'Sharding Plan generated' tables."""
    tables = [bag("product_table", 4096, 64, ["product"]), bag("user_table", 4096, 64, ["user"])]
    planner = EmbeddingShardingPlanner(Topology(world_size=1, compute_device="cuda"))
    plan = planner.collective_plan(tables)
    expected = """module:
param | sharding type | compute kernel | ranks
------------- | ------------- | -------------- | -----
product_table | table_wise | fused | [0]
user_table | table_wise | fused | [0]
param | shard offsets | shard sizes | placement
------------- | ------------- | ----------- | -------------
product_table | [0, 0] | [4096, 64] | rank:0/cuda:0
user_table | [0, 0] | [4096, 64] | rank:0/cuda:0"""
    assert squash(str(plan)) == squash(expected)
    assert plan.plan[""]["user_table"].sharding_type == "table_wise"


@pytest.mark.parametrize("sharding_type", [t.value for t in ShardingType])
def test_every_sharding_type_can_be_planned(sharding_type):
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=GIB, batch_size=16)
    tables = [bag("a", 1000, 64), bag("b", 37, 32)]
    constraints = {name: ParameterConstraints(sharding_types=[sharding_type]) for name in ("a", "b")}
    plan = EmbeddingShardingPlanner(topo, constraints=constraints).plan(tables)
    for name, ps in plan.plan[""].items():
        assert ps.sharding_type == sharding_type
    validate_plan(plan, tables, world_size=4)


def test_mixed_types_dataframe_and_determinism():
    frame = pd.DataFrame({
        "name": ["big", "wide", "small", "tiny"],
        "num_embeddings": [2_000_000, 50_000, 5_000, 10],
        "embedding_dim": [64, 256, 32, 16],
        "feature_names": ["big_f", "wide_f, wide_g", ["small_f"], "tiny_f"],
        "pooling": ["SUM", "MEAN", "SUM", "SUM"],
        "pooling_factor": [20.0, 2.0, 1.0, 1.0],
    })
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=400 * 1024**2, batch_size=256)
    first = EmbeddingShardingPlanner(topo).plan(frame)
    second = EmbeddingShardingPlanner(topo).plan(frame)
    assert str(first) == str(second)
    assert first.plan[""]["wide"].shards and set(first.plan[""]) == {"big", "wide", "small", "tiny"}
    # "big" is 488 MiB of weights: it cannot sit whole on one 400 MiB rank
    assert first.plan[""]["big"].sharding_type != "table_wise"
    validate_plan(first, frame, world_size=4)


def test_module_input_finds_nested_collections():
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.sparse = torch.nn.Module()
            self.sparse.ebc = EmbeddingBagCollection([bag("t1", 100, 8), bag("t2", 50, 8)], device="meta")
            self.ec = EmbeddingCollection([EmbeddingConfig(name="s", num_embeddings=20, embedding_dim=8,
                                                           feature_names=["s_f"])], device="meta")
            self.dense = torch.nn.Linear(10, 10)

    planner = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu", batch_size=4))
    model = Model()
    plan = planner.plan(model)
    assert set(plan.plan) == {"sparse.ebc", "ec"}
    assert set(plan.plan["sparse.ebc"]) == {"t1", "t2"}
    assert plan.plan["ec"]["s"].sharding_type in {"table_wise", "column_wise", "row_wise", "data_parallel"}
    report = planner.report()
    # the Linear's 110 fp32 parameters + gradients are a dense replica on every rank
    assert (report.memory["dense"] == 110 * 4 * 2).all()
    # also when the plan is priced as a plan from elsewhere (tables=the model), and without runner-ups
    assert (planner.report(plan, tables=model).memory["dense"] == 110 * 4 * 2).all()
    quick = planner.report(runner_ups=False)
    assert quick.tables["runner_up"].isna().all() and report.tables["reason"].notna().all()
    assert quick.memory.equals(report.memory)


def test_plan_that_does_not_fit_names_tables_shortfall_and_fix():
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=100 * 1024**2, ddr_cap=150 * 1024**2, batch_size=8)
    tables = [bag("huge", 1_000_000, 64), bag("ok", 1000, 16)]  # huge: 244 MiB of weights, 200 MiB HBM in all
    constraints = {"huge": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])}
    with pytest.raises(PlannerError) as info:
        EmbeddingShardingPlanner(topo, constraints=constraints, optimizer="adam").plan(tables)
    error = info.value
    assert error.tables == ["huge"]
    assert "huge" in str(error) and "over its" in str(error)
    assert any(b > 0 for b in error.shortfall_bytes.values())
    assert "row_wise" in str(error) and "optimizer" in str(error)


def test_only_fits_with_uvm_caching():
    """2 x 244 MiB of fp32 weights, 2 x 150 MiB of HBM: only UVM caching fits (and it beats plain UVM)."""
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=150 * 1024**2, ddr_cap=8 * GIB, batch_size=8)
    tables = [bag("huge", 1_000_000, 64), bag("huge2", 1_000_000, 64)]
    fused_only = {t.name: ParameterConstraints(compute_kernels=["fused"]) for t in tables}
    with pytest.raises(PlannerError, match="do not fit"):
        EmbeddingShardingPlanner(topo, constraints=fused_only).plan(tables)
    planner = EmbeddingShardingPlanner(topo)
    plan = planner.plan(tables)
    kernels = {ps.compute_kernel for ps in plan.plan[""].values()}
    assert "fused_uvm_caching" in kernels and "fused_uvm" not in kernels
    report = planner.report()
    assert report.summary["fits"] and (report.memory["hbm_bytes"] <= 150 * 1024**2).all()
    cached = report.placement[report.placement["compute_kernel"] == "fused_uvm_caching"]
    # by hand, per shard (sgd: no optimizer state): the weights live in host memory (DDR), 20% of them
    # (the default cache load factor) are cached in HBM beside the buffers: each shard receives the ids of
    # 2 ranks x 8 samples x 1 id, scaled by its share of the rows (4 B lengths + 8 B ids), and writes
    # 16 pooled rows of its columns
    ids = 16 * cached["rows"] / 1_000_000
    buffers = 4 * 16 + 8 * ids + 4 * cached["columns"] * 16
    np.testing.assert_allclose(cached["ddr_bytes"], 4 * cached["rows"] * cached["columns"])
    np.testing.assert_allclose(cached["hbm_bytes"], 0.2 * 4 * cached["rows"] * cached["columns"] + buffers)
    reasons = " ".join(report.tables["reason"])
    assert "fused_uvm_caching: faster kernels do not fit in HBM" in reasons


def test_constraints_allowing_nothing_name_table_and_constraint():
    topo = Topology(world_size=2, compute_device="cuda", batch_size=8)
    constraints = {"t": ParameterConstraints(sharding_types=["data_parallel"], compute_kernels=["fused"])}
    with pytest.raises(PlannerError, match=r"table 't'.*sharding_types=\['data_parallel'\].*compute_kernels=\['fused'\]"):
        EmbeddingShardingPlanner(topo, constraints=constraints).plan([bag("t", 10, 8)])
    with pytest.warns(UserWarning, match=r"not in the input, so they constrain nothing: \['nope'\]"):  # as TorchRec
        plan = EmbeddingShardingPlanner(topo, constraints={"nope": ParameterConstraints()}).plan([bag("t", 10, 8)])
    assert list(plan.get_plan_for_module("")) == ["t"]


def test_constraints_accept_strings_and_members():
    c = ParameterConstraints(sharding_types=["ROW_WISE", ShardingType.TABLE_WISE, "column_wise"])
    assert c.sharding_types == ["row_wise", "table_wise", "column_wise"]
    with pytest.raises(ValueError, match="unknown sharding type"):
        ParameterConstraints(sharding_types=["diagonal"])


def test_report_frames_are_consistent():
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=GIB, batch_size=64)
    tables = [bag(f"t{i}", 10 ** (3 + i % 3), 32) for i in range(6)]
    planner = EmbeddingShardingPlanner(topo, stats=WorkloadStats({f"t{i}_f": 1.0 + i for i in range(6)}))
    planner.plan(tables)
    report = planner.report()
    assert list(report.placement.columns) == ["module", "table", "shard", "sharding_type", "compute_kernel", "rank",
                                              "host", "row_offset", "rows", "col_offset", "columns", "weight_bytes",
                                              "optimizer_bytes", "hbm_bytes", "ddr_bytes"]
    assert len(report.memory) == 4 and len(report.time) == 4
    assert {f"{c}_ms" for c in COLLECTIVES} <= set(report.time.columns)
    # weights per rank = sum of the placement rows on that rank; and 4 bytes x rows x columns per shard
    per_rank = report.placement.groupby("rank")["weight_bytes"].sum().reindex(range(4), fill_value=0)
    np.testing.assert_allclose(report.memory["weights"], per_rank)
    np.testing.assert_allclose(report.placement["weight_bytes"], 4 * report.placement["rows"] * report.placement["columns"])
    total = sum(m.values.sum() - np.trace(m.values) for m in report.traffic.values())
    assert report.summary["total_bytes"] == pytest.approx(total)
    assert report.summary["max_time_ms"] == pytest.approx(report.time["total_ms"].max())
    # the search's own estimate of the slowest rank equals the report's
    assert report.summary["max_time_ms"] == pytest.approx(float(planner.last.state.time.max()), rel=1e-9)
    assert report.tables["reason"].notna().all() and len(report.tables) == 6


def test_explain_answers_why_not():
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=200 * 1024**2, batch_size=64)
    tables = [bag("big", 1_000_000, 64), bag("small", 100, 64)]
    constraints = {"small": ParameterConstraints(sharding_types=["table_wise", "row_wise"]),
                   "big": ParameterConstraints(compute_kernels=["fused"])}
    planner = EmbeddingShardingPlanner(topo, constraints=constraints)
    planner.plan(tables)
    why = planner.explain("big", "table_wise")
    # 1e6 x 64 fp32 = 244 MiB > 200 MiB
    assert why.startswith("Why not TABLE_WISE for big?") and "does not fit: needs 244.2 MiB of HBM" in why  # weights + buffers
    assert "table is 244.1 MiB; table-wise needs" in planner.report().tables.set_index("table").loc["big", "reason"]
    uvm = EmbeddingShardingPlanner(topo)
    uvm.plan(tables)
    assert "table_wise/fused_uvm_caching" in uvm.explain("big", "table_wise")
    assert "only" in planner.explain("small", "column_wise")
    overview = planner.explain("small")
    assert "Alternatives" in overview and "row_wise" in overview
    # each shard's terms: the ids it receives (2 ranks x 64 bags, one id each, over its rows) and the rows they read
    # (one per id without a calibration: TorchRec's bandwidth model)
    shard_lines = re.findall(r"rank (\d): (\d+) x 64 \([^)]*\), ([\d,]+) ids reading ([\d,]+) rows at", overview)
    assert shard_lines and all(int(ids.replace(",", "")) == int(reads.replace(",", "")) == 128 * int(rows) // 100
                               for _, rows, ids, reads in shard_lines)


def test_report_of_real_batches_matches_traffic_exactly():
    from rectoolkit.plan.traffic import batch_id_counter, step_traffic
    from rectoolkit.sparse import KeyedJaggedTensor

    topo = Topology(world_size=2, compute_device="cpu", batch_size=3)
    tables = [bag("a", 20, 8, ["fa"]), bag("b", 30, 4, ["fb"])]
    planner = EmbeddingShardingPlanner(topo, constraints={"a": ParameterConstraints(sharding_types=["row_wise"])})
    plan = planner.plan(tables)
    batches = [KeyedJaggedTensor(keys=["fa", "fb"], values=torch.tensor([1, 15, 19, 2, 3, 29]),
                                 lengths=torch.tensor([1, 2, 0, 1, 1, 1])),
               KeyedJaggedTensor(keys=["fa", "fb"], values=torch.tensor([11, 0, 7]), lengths=torch.tensor([0, 1, 1, 0, 1, 0]))]
    report = planner.report(batches=batches)
    # rank 0 sends row block [10, 20) of table a its ids 15, 19 (+ 3 lengths): 12 + 16 bytes
    expected = step_traffic(plan.plan[""], tables, 2, 2, [3, 3], batch_id_counter(batches))
    for name in COLLECTIVES:
        np.testing.assert_array_equal(report.traffic[name].values, expected[name])
    assert report.traffic["input_dist"].values[0, 1] >= 28


def test_objectives():
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=GIB, batch_size=128)
    tables = [bag(f"t{i}", 5000 * (i + 1), 64) for i in range(8)]
    reports = {}
    for objective in ("time", "memory", "bytes"):
        planner = EmbeddingShardingPlanner(topo, objective=objective)
        planner.plan(tables)
        reports[objective] = planner.report()
    assert reports["bytes"].summary["total_bytes"] <= reports["time"].summary["total_bytes"] + 1e-6
    spread = {k: r.summary["max_hbm_bytes"] for k, r in reports.items()}
    assert spread["memory"] <= spread["time"] + 1e-6
    with pytest.raises(ValueError, match="objective"):
        EmbeddingShardingPlanner(topo, objective="fast").plan(tables)


def test_workload_stats_from_batches():
    from rectoolkit.sparse import KeyedJaggedTensor

    kjts = [KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(7), lengths=torch.tensor([1, 3, 2, 1])),
            KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(2), lengths=torch.tensor([0, 0, 2, 0]))]
    stats = WorkloadStats.from_batches(kjts)
    assert stats.pooling_factors == {"a": 1.0, "b": 1.25} and stats.batch_size == 2


def test_topology_validation():
    with pytest.raises(ValueError, match="multiple of local_world_size"):
        Topology(world_size=6, local_world_size=4)
    with pytest.raises(ValueError, match="cores_per_host"):
        Topology(world_size=2, cores_per_host=0)
    with pytest.raises(FileNotFoundError, match="python -m rectoolkit.planner.calibrate"):
        Topology(world_size=2, profile="/nonexistent/profile.json")


def test_dataframe_columns_aliases_and_errors():
    frame = pd.DataFrame({"table": ["a", "b"], "rows": [100, 50], "dim": [8, 4], "module_path": ["ebc", "ebc"],
                          "feature_names": ["fa; fa2", None], "pooling": ["SUM", "NONE"]})
    planner = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu", batch_size=4))
    plan = planner.plan(frame)
    assert set(plan.plan["ebc"]) == {"a", "b"}
    tables = {t.name: t for t in planner.last.tables}
    assert tables["a"].config.feature_names == ["fa", "fa2"] and tables["b"].config.feature_names == ["b"]
    assert tables["a"].pooled and not tables["b"].pooled
    with pytest.raises(ValueError, match=r"row 1 \(table 'b'\): rows='many'"):
        planner.plan(frame.assign(rows=[100, "many"]))
    with pytest.raises(ValueError, match=r"needs a column for the embedding dim \(one of \[.embedding_dim., .dim.,"):
        planner.plan(frame.drop(columns=["dim"]))


def test_the_planner_plans_for_one_batch_size():
    from rectoolkit.planner import WorkloadStats

    tables = [EmbeddingBagConfig(name="t", num_embeddings=1000, embedding_dim=8, feature_names=["f"])]
    topo = Topology(world_size=2, compute_device="cpu", batch_size=1024)
    # the argument, else the statistics', else the topology's: and every estimate uses it
    for planner, expected in ((EmbeddingShardingPlanner(topo), 1024),
                              (EmbeddingShardingPlanner(topo, stats=WorkloadStats({"f": 2.0}, batch_size=256)), 256),
                              (EmbeddingShardingPlanner(topo, batch_size=64), 64),
                              (EmbeddingShardingPlanner(topo, batch_size=64, stats=WorkloadStats({}, 64)), 64)):
        planner.plan(tables)
        assert planner.batch_size == expected
        assert [t.batch_sizes for t in planner.last.tables] == [[expected]]
        assert planner.last.cost_model.topology.batch_size == expected
    with pytest.raises(ValueError, match=r"batch_size=64 but stats.batch_size=256"):
        EmbeddingShardingPlanner(topo, batch_size=64, stats=WorkloadStats({}, batch_size=256))
    with pytest.raises(ValueError, match="positive int"):
        EmbeddingShardingPlanner(topo, batch_size=0)


def test_planning_pauses_the_garbage_collector_and_restores_it(monkeypatch):
    import gc

    import rectoolkit.planner.planner as planner_module

    seen = []
    collect = planner_module.collect_tables

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return collect(*args, **kwargs)

    monkeypatch.setattr(planner_module, "collect_tables", spy)
    topo = Topology(world_size=2, compute_device="cpu", batch_size=8)
    assert gc.isenabled()
    EmbeddingShardingPlanner(topo).plan([bag("a", 100, 8)])
    assert seen == [False] and gc.isenabled()
    too_big = Topology(world_size=2, compute_device="cuda", hbm_cap=1024**2, ddr_cap=1024**2, batch_size=8)
    with pytest.raises(PlannerError):  # back on after an error too
        EmbeddingShardingPlanner(too_big).plan([bag("huge", 1_000_000, 64)])
    assert gc.isenabled()
    gc.disable()
    try:  # a caller that turned it off keeps it off
        EmbeddingShardingPlanner(topo).plan([bag("a", 100, 8)])
        assert not gc.isenabled()
    finally:
        gc.enable()
