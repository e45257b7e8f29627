"""The machine's load factor (rectoolkit.planner.load) and how the cost model and its report carry it."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.planner import EmbeddingShardingPlanner, Topology
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner import probe_load
from rectoolkit.planner.load import PROBE_IDS, PROBE_SEGMENTS, PROBE_WARMUP, LoadProbe, SyntheticStep
from rectoolkit.planner.profile import CalibrationProfile
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
    assert last.sharding_type == "machine load (x1.50, x1.00 alone)" and last.total_ms == pytest.approx(0.5 * quiet.step_time_ms)
    assert report.step.total_ms.sum() == pytest.approx(report.summary["step_time_ms"])
    assert "machine load" in busy_planner.explain() and "machine load" not in quiet_planner.explain()
    assert "machine load (x" not in " ".join(quiet_planner.report().step.sharding_type)


def test_a_plan_whose_other_rank_mostly_waits_gets_less_of_the_load():
    """Under load, a rank competes for the cores with the work beside it: the probe's factor is for ranks all busy;
    with every table on rank 0, rank 1 is busy only for the fixed work, so only that share of the factor is added."""
    topology = Topology(world_size=2, compute_device="cpu", load_factor=2.0)
    tables = collect_tables(TABLES, 512)
    model = CostModel(topology, tables=tables)
    on_rank0 = rtk.ShardingPlan({"": {t.name: rtk.ParameterSharding("table_wise", ranks=[0], shards=[
        rtk.ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in TABLES}})
    cost = model.evaluate(on_rank0, tables)
    work = cost.lookup_fwd_ms + cost.lookup_bwd_ms
    assert work[1] == 0.0 and work[0] > 0.0
    quiet = cost.step.quiet_ms
    rank1_busy = 1.0 - work[0] / quiet  # the share of the quiet step rank 1 works (its fixed costs)
    assert 0.0 < rank1_busy < 1.0
    assert cost.step.load_share == pytest.approx(rank1_busy)
    assert cost.step_time_ms == pytest.approx(quiet * (1.0 + 1.0 * rank1_busy))
    assert cost.step_time_ms < 2.0 * quiet
    twins = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16, feature_names=[f"f{i}"])
             for i in range(2)]
    one_each = rtk.ShardingPlan({"": {t.name: rtk.ParameterSharding("table_wise", ranks=[i], shards=[
        rtk.ShardMetadata.on_rank(i, 0, 0, 1000, 16)]) for i, t in enumerate(twins)}})
    balanced = CostModel(topology, tables=collect_tables(twins, 512)).evaluate(one_each, collect_tables(twins, 512))
    assert balanced.step.load_share == 1.0 and balanced.step_time_ms == pytest.approx(2.0 * balanced.step.quiet_ms)
    alone = CostModel(dataclasses.replace(topology, load_factor=1.0), tables=tables).evaluate(on_rank0, tables)
    assert alone.step_time_ms == pytest.approx(quiet)  # no load, nothing added whatever the share


def test_with_the_factor_alone_a_plan_whose_other_rank_waits_is_priced_between_the_two_factors():
    """load_factor_alone is the probe's slowdown with one rank working: a plan gets it plus the share of the
    difference its other ranks' busy share gives (cost.step_at_load)."""
    probe = LoadProbe(factor=2.0, quiet_ms=8.0, median_ms=20.0, reference_ms=10.0, steps=40, world_size=2,
                      load_average=(1.0, 1.0, 1.0), cores=2, factor_alone=1.3)
    topology = Topology(world_size=2, compute_device="cpu").at_load(probe)
    assert (topology.load_factor, topology.load_factor_alone) == (2.0, 1.3)
    assert Topology(world_size=2, compute_device="cpu").at_load(probe.to_dict()) == topology
    old_probe = {**probe.to_dict(), "factor_alone": None}  # a probe saved before the factor alone was measured
    assert Topology(world_size=2, compute_device="cpu").at_load(old_probe).load_factor_alone == 1.0
    tables = collect_tables(TABLES, 512)
    on_rank0 = rtk.ShardingPlan({"": {t.name: rtk.ParameterSharding("table_wise", ranks=[0], shards=[
        rtk.ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in TABLES}})
    cost = CostModel(topology, tables=tables).evaluate(on_rank0, tables)
    share, quiet = cost.step.load_share, cost.step.quiet_ms
    assert 0.0 < share < 1.0
    assert cost.step_time_ms == pytest.approx(quiet * (1.3 + 0.7 * share))
    assert 1.3 * quiet < cost.step_time_ms < 2.0 * quiet
    assert cost.step.load_ms == pytest.approx(cost.step_time_ms - quiet)
    planner = EmbeddingShardingPlanner(topology)
    planner.plan(TABLES)
    assert planner.report().step.iloc[-1].sharding_type == "machine load (x2.00, x1.30 alone)"
    assert "A = load_factor_alone 1.30" in planner.explain()
    with pytest.raises(TypeError, match="Topology.at_load: expected a LoadProbe"):
        topology.at_load(2.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, True, float("nan"), float("inf"), "2"])
@pytest.mark.parametrize("field", ["load_factor", "load_factor_alone"])
def test_a_load_factor_not_a_positive_number_is_refused(field, bad):
    with pytest.raises(ValueError, match=f"{field} must be a positive number.*probe_load"):
        Topology(world_size=2, compute_device="cpu", **{field: bad})


def test_the_probe_describes_itself():
    probe = LoadProbe(factor=2.0, quiet_ms=4.0, median_ms=10.0, reference_ms=5.0, steps=40, world_size=2,
                      load_average=(3.0, 2.0, 1.0), cores=2)
    assert probe.to_dict()["factor"] == 2.0 and probe.to_dict()["load_average"] == [3.0, 2.0, 1.0]
    assert "load factor 2.00" in str(probe) and "10.0 ms wall for 5.0 ms of work" in str(probe)
    assert "one rank working" not in str(probe)
    assert "load factor 2.00, 1.40 with one rank working" in str(dataclasses.replace(probe, factor_alone=1.4))


class _SlowPeer(SyntheticStep):
    """Rank 1 sleeps SLEEP_MS in every step, as a rank the operating system has descheduled would."""

    def _step(self) -> None:
        import torch.distributed as dist

        if dist.get_rank() == 1:
            time.sleep(SLEEP_MS / 1000)
        super()._step()


SLEEP_MS = 30.0


def _probe_with_a_slow_peer(ctx) -> dict:
    quiet = SyntheticStep()
    quiet.run(5)
    slow = _SlowPeer()
    slow.run(5)
    reference = quiet.probe().median_ms
    lookups, embedding_bag = [], torch.nn.functional.embedding_bag

    def counted(*args, **kwargs):
        lookups.append(args[0].numel())
        return embedding_bag(*args, **kwargs)

    torch.nn.functional.embedding_bag = counted
    try:
        one_working = SyntheticStep(alone=True)
        one_working.run(5)
    finally:
        torch.nn.functional.embedding_bag = embedding_bag
    return {"quiet": quiet.probe().to_dict(), "slow": slow.probe(reference).to_dict(),
            "slow_alone": slow.probe().to_dict(), "reference": reference,
            "both": quiet.probe(alone=one_working).to_dict(),
            "ids_looked_up_one_working": sum(lookups)}


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_the_probe_prices_a_rank_that_waits_for_a_descheduled_peer():
    """Every step waits for rank 1's 30 ms sleep (wall time, no CPU): the slowest rank's median wall time holds
    it, and the factor is that median over the reference (here the same probe without the sleep)."""
    from rectoolkit.launch import launch

    with pytest.raises(ValueError, match="world_size must be a positive int"):
        probe_load(0)
    results = launch(_probe_with_a_slow_peer, 2, num_threads=1, backend="gloo", timeout_s=240, echo_output=False)
    result = results[0]
    # with one rank working, rank 0 does the whole step's lookups and rank 1 none (it only joins the all-reduces);
    # counted, not timed: CPU time is no witness here, since two ranks reading 48 MiB each share the memory bus
    rank0, rank1 = results
    steps = PROBE_WARMUP + 5
    assert rank0["ids_looked_up_one_working"] == steps * PROBE_SEGMENTS * PROBE_IDS
    assert rank1["ids_looked_up_one_working"] == 0
    both = result["both"]
    assert both["factor"] == pytest.approx(result["quiet"]["factor"]) and both["factor_alone"] > 0.5
    quiet, slow, alone = result["quiet"], result["slow"], result["slow_alone"]
    assert quiet["steps"] == slow["steps"] == 5 and quiet["world_size"] == slow["world_size"] == 2
    assert slow["median_ms"] >= SLEEP_MS  # every step of the slowest rank holds the sleep
    assert slow["factor"] == pytest.approx(slow["median_ms"] / result["reference"], rel=1e-2)
    assert alone["factor"] == pytest.approx(alone["median_ms"] / alone["reference_ms"], rel=1e-2)
    assert alone["quiet_ms"] <= alone["reference_ms"] and slow["reference_ms"] == pytest.approx(result["reference"])
    assert alone["factor"] >= SLEEP_MS / alone["reference_ms"]  # wall holds the sleep, CPU time does not
    assert slow["factor"] >= SLEEP_MS / result["reference"] and quiet["factor"] >= 1.0


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_probe_load_runs_its_own_workers_and_divides_wall_by_work():
    probe = probe_load(2, steps=5, min_seconds=0.0, timeout_s=240)
    assert probe.steps == 5 and probe.world_size == 2 and probe.median_ms > 0
    assert 0 < probe.quiet_ms <= probe.reference_ms  # the median CPU time is at least the quietest step's
    assert probe.reference_ms <= probe.median_ms  # a rank's CPU time never exceeds its wall time
    assert probe.factor == pytest.approx(probe.median_ms / probe.reference_ms, rel=1e-2) and probe.factor >= 1.0
    assert probe.factor_alone is not None and probe.factor_alone > 0.5  # measured: 5 steps with rank 0 working alone


def test_explain_gives_the_step_at_the_load_the_calibration_measured():
    """A profile's terms are its fastest repeats; the load its calibration probed tells what a step meets on the
    machine as it was then. explain() gives it beside the quiet estimate (which still ranks the plans)."""
    probe = LoadProbe(factor=1.5, quiet_ms=8.0, median_ms=12.0, reference_ms=8.0, steps=40, world_size=2,
                      load_average=(1.0, 1.0, 1.0), cores=2, factor_alone=1.2)
    base = CalibrationProfile.from_topology(Topology(world_size=2, compute_device="cpu"))
    profile = dataclasses.replace(base, machine={**base.machine, "load_probe": probe.to_dict()})
    topology = Topology(world_size=2, compute_device="cpu", profile=profile)
    planner = EmbeddingShardingPlanner(topology)
    plan = planner.plan(TABLES)
    text = planner.explain()
    step = CostModel(topology).evaluate(plan, collect_tables(TABLES, 512)).step
    at_load = step.quiet_ms * (1.2 + (1.5 - 1.2) * step.load_share)  # step_at_load by hand
    assert f"At the load the calibration measured (factor 1.50, 1.20 with one rank working): {at_load:.3f} ms" in text
    assert f"Estimated step: {step.quiet_ms:.3f} ms" in text  # the quiet estimate stays the one shown first
    without = dataclasses.replace(base, machine={k: v for k, v in base.machine.items() if k != "load_probe"})
    quiet_planner = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu", profile=without))
    quiet_planner.plan(TABLES)
    assert "At the load the calibration measured" not in quiet_planner.explain()
    loaded = EmbeddingShardingPlanner(topology.at_load(probe))  # already priced at a load: that line is the estimate
    loaded.plan(TABLES)
    assert "At the load the calibration measured" not in loaded.explain() and "machine load" in loaded.explain()
