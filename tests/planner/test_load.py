"""The machine's load factor (rectoolkit.planner.load) and how the cost model and its report carry it."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest

import rectoolkit as rtk
from rectoolkit.planner import EmbeddingShardingPlanner, Topology
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.load import LoadProbe, probe_load
from rectoolkit.planner.tables import collect_tables

TABLES = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 * (i + 1), embedding_dim=16 * (i + 1),
                                 feature_names=[f"f{i}"]) for i in range(4)]


def test_the_load_factor_multiplies_the_step_estimate_and_shows_as_its_own_part():
    quiet_topology = Topology(world_size=2, compute_device="cpu")
    busy_topology = dataclasses.replace(quiet_topology, load_factor=1.5)
    tables = collect_tables(TABLES, 512)
    quiet_plan = EmbeddingShardingPlanner(quiet_topology).plan(TABLES)
    busy_plan = EmbeddingShardingPlanner(busy_topology).plan(TABLES)
    assert busy_plan == quiet_plan  # the same slowdown for every plan: the choice does not move
    quiet = CostModel(quiet_topology).evaluate(quiet_plan, tables)
    busy = CostModel(busy_topology).evaluate(quiet_plan, tables)
    assert quiet.step.load_ms == 0.0 and quiet.step_time_ms == pytest.approx(quiet.step.quiet_ms)
    assert busy.step.quiet_ms == pytest.approx(quiet.step_time_ms)
    assert busy.step_time_ms == pytest.approx(1.5 * quiet.step_time_ms)
    assert busy.step.parts()["load_ms"] == pytest.approx(0.5 * quiet.step_time_ms)
    assert sum(busy.step.parts().values()) == pytest.approx(busy.step_time_ms)
    busy_planner, quiet_planner = EmbeddingShardingPlanner(busy_topology), EmbeddingShardingPlanner(quiet_topology)
    busy_planner.plan(TABLES)
    quiet_planner.plan(TABLES)
    report = busy_planner.report()
    last = report.step.iloc[-1]
    assert last.sharding_type == "machine load (x1.50)" and last.total_ms == pytest.approx(0.5 * quiet.step_time_ms)
    assert report.step.total_ms.sum() == pytest.approx(report.summary["step_time_ms"])
    assert "machine load" in busy_planner.explain() and "machine load" not in quiet_planner.explain()
    assert "machine load (x" not in " ".join(quiet_planner.report().step.sharding_type)


@pytest.mark.parametrize("bad", [0.0, -1.0, True, float("nan"), float("inf"), "2"])
def test_a_load_factor_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="load_factor must be a positive number.*probe_load"):
        Topology(world_size=2, compute_device="cpu", load_factor=bad)


def test_the_probe_describes_itself():
    probe = LoadProbe(factor=2.0, quiet_ms=5.0, median_ms=10.0, steps=40, world_size=2, load_average=(3.0, 2.0, 1.0),
                      cores=2)
    assert probe.to_dict()["factor"] == 2.0 and "load factor 2.00" in str(probe) and "10.0 ms vs 5.0 ms" in str(probe)


def _spinners(count: int) -> list:
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(count)]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_the_probe_sees_busy_cores():
    """Two ranks probe alone, then with twice as many busy loops as this process may use cores: each rank then
    gets well under half a core, so its synthetic step takes well over 1.5x its quiet CPU time."""
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        probe_load(0)
    alone = probe_load(2, timeout_s=240)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    busy = _spinners(2 * cores)
    try:
        loaded = probe_load(2, timeout_s=240)
    finally:
        for process in busy:
            process.kill()
        for process in busy:
            process.wait(timeout=30)
    assert alone.world_size == loaded.world_size == 2 and alone.steps == loaded.steps
    assert alone.quiet_ms > 0 and alone.median_ms >= alone.quiet_ms and alone.factor >= 1.0
    assert loaded.factor > 1.5, (alone, loaded)
    assert loaded.factor > alone.factor, (alone, loaded)
