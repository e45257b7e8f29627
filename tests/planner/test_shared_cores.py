"""Ranks beyond a host's cores: the step's CPU work between lookups (fixed costs, collective latencies and bytes)
priced as shared by them, shown in the report and explain(), and a load probe of such ranks not counted twice."""

import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.load import load_factors
from rectoolkit.planner.planner import EmbeddingShardingPlanner
from rectoolkit.planner.profile import AlphaBeta, CalibrationProfile
from rectoolkit.planner.tables import collect_tables
from rectoolkit.planner.topology import Topology

PROFILE = CalibrationProfile(collectives={"all_to_all": AlphaBeta(0.5, 1000.0), "all_reduce": AlphaBeta(1.0, 2000.0)},
                             read_curve=((1e3, 100.0), (1e6, 10.0)), write_bytes_per_ms=1000.0, step_ms=2.0,
                             group_ms={"table_wise": 3.0}, shard_ms=0.25, memory_parallelism=2.0)
TABLES = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16, feature_names=[f"f{i}"])
          for i in range(4)]


def _plan_and_cost(cores):
    topology = Topology(world_size=4, compute_device="cpu", batch_size=64, profile=PROFILE, cores_per_host=cores)
    planner = EmbeddingShardingPlanner(topology, batch_size=64)
    plan = planner.plan(TABLES)
    tables = collect_tables(TABLES, 64)
    return planner, plan, CostModel(topology, "sgd", 0.0, tables).evaluate(plan, tables)


def test_four_ranks_on_two_cores_double_the_cpu_work_between_lookups():
    _, plan, own_cores = _plan_and_cost(4)
    planner, _, shared = _plan_and_cost(2)
    assert own_cores.step.oversubscription == 1.0 and own_cores.step.shared_cores_ms == 0.0
    step = shared.step
    assert step.oversubscription == 2.0
    cpu = step.step_fixed_ms + sum(g.fixed_ms + g.latency_ms + g.comm_fwd_ms + g.comm_bwd_ms for g in step.groups)
    assert cpu > 0 and step.shared_cores_ms == pytest.approx(cpu)  # by hand: (4 / 2 - 1) x the CPU parts
    assert step.quiet_ms == pytest.approx(step.step_fixed_ms + sum(g.total_ms for g in step.groups) + cpu)
    assert step.parts()["shared_cores_ms"] == pytest.approx(cpu)
    # the report's step frame has the row, and its total is the estimate; explain() names the term
    frame = planner.report().step
    row = frame[frame.sharding_type == "ranks beyond the cores (x2.00)"]
    assert row.total_ms.tolist() == [pytest.approx(cpu)]
    assert frame.total_ms.sum() == pytest.approx(planner.report().summary["step_time_ms"])
    assert "+ ranks beyond the cores" in planner.explain() and "4 busy ranks on 2 cores" in planner.explain()


def test_a_probe_of_more_ranks_than_cores_leaves_out_the_waiting_the_model_prices():
    assert load_factors({"factor": 2.4, "factor_alone": 1.3, "world_size": 4, "cores": 2}) == (1.2, 1.3)
    assert load_factors({"factor": 1.6, "world_size": 4, "cores": 2}) == (1.0, 1.0)  # never below 1
    assert load_factors({"factor": 1.6, "world_size": 2, "cores": 2}) == (1.6, 1.0)  # no more ranks than cores
    topology = Topology(world_size=4, compute_device="cpu").at_load({"factor": 3.0, "world_size": 4, "cores": 2})
    assert topology.load_factor == 1.5
