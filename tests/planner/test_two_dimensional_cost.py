"""2D parallelism priced (rectoolkit.planner.two_dimensional): the group's topology for each layout, one sync's
time worked out by hand from a profile, the hosts' cores shared by every group, the comparison over group sizes,
and on 4 gloo ranks the memory, bytes and calls a real DMPCollection has against the estimate."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.planner import EmbeddingShardingPlanner
from rectoolkit.planner.profile import CalibrationProfile
from rectoolkit.planner.tables import collect_tables
from rectoolkit.planner.topology import Topology
from rectoolkit.planner.two_dimensional import compare_sharding_group_sizes, group_topology, price_two_dimensional

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "distributed"))
sys.path.insert(0, os.path.dirname(__file__))
from dist_harness import column_wise, row_wise, run_workers, table_wise  # noqa: E402
from test_collective_pairs import PAIRS, PLAN, TABLES, profile_with  # noqa: E402

PROFILE = profile_with(PAIRS)  # test_collective_pairs' profile, tables and plan: t whole on rank 1, d replicated
# (3,200 bytes each); here a plan for a sharding group of 2


# ---- the group's topology --------------------------------------------------------------------------------------
def test_group_topology_puts_the_layouts_ranks_on_hosts_and_takes_each_positions_smallest_capacity():
    world = Topology(world_size=8, compute_device="cuda", local_world_size=4, hbm_cap=[8, 7, 6, 5, 4, 3, 2, 1],
                     batch_size=32)
    strided = group_topology(world, 4)  # groups [0, 2, 4, 6], [1, 3, 5, 7]: 2 ranks a host, positions = pairs
    assert (strided.world_size, strided.local_world_size, strided.batch_size) == (4, 2, 32)
    assert strided.hbm_caps() == [7, 5, 3, 1]
    contiguous = group_topology(world, 4, use_inter_host_allreduce=True)  # groups [0..3], [4..7]: one host each
    assert (contiguous.world_size, contiguous.local_world_size) == (4, 4)
    assert contiguous.hbm_caps() == [4, 3, 2, 1]
    assert group_topology(world, 8).hbm_caps() == [8, 7, 6, 5, 4, 3, 2, 1]  # one group: the world itself
    assert group_topology(world, 2).local_world_size == 1  # [0, 4]: a rank on each host


def test_group_topology_refuses_a_size_that_does_not_divide_the_world_or_spreads_a_group_unevenly():
    with pytest.raises(ValueError, match="sharding_group_size=3 does not divide the world size 8"):
        group_topology(Topology(world_size=8, compute_device="cpu"), 3)
    # 12 ranks, 4 a host, groups of 4 strided: [0, 3, 6, 9] has 2 ranks on host 0, 1 on hosts 1 and 2
    with pytest.raises(ValueError, match=r"sharding_group_size=4 puts a sharding group's ranks unevenly on the hosts "
                                         r"of 4 ranks \(the strided layout"):
        group_topology(Topology(world_size=12, compute_device="cpu", local_world_size=4), 4)


# ---- one sync, by hand -----------------------------------------------------------------------------------------
def test_one_sync_on_two_replicas_is_priced_from_its_bytes_calls_and_copies_by_hand():
    world = Topology(world_size=4, compute_device="cpu", batch_size=4, profile=PROFILE)
    cost = price_two_dimensional(PLAN, TABLES, world, 2, sync_interval=4, batch_size=4)
    # strided: sharding groups [0, 2] and [1, 3]; position 0 (ranks 0, 1) holds d, position 1 (ranks 2, 3) t and d.
    # Two replicas all-reduce: each sends the other half of every tensor, then its own half back: its bytes.
    assert cost.replicas == 2
    assert cost.sync_bytes.tolist() == [3200, 3200, 6400, 6400]
    # at the all-reduce speed, 2000 bytes/ms (the profile's 1000 for all-to-all within a host, x 2000 / 1000),
    # sent and received
    np.testing.assert_allclose(cost.sync_parts["bytes"], [6400 / 2000, 6400 / 2000, 12800 / 2000, 12800 / 2000])
    np.testing.assert_allclose(cost.sync_parts["latency"], [1.0] * 4)  # one float32 all-reduce each
    # the tensors copied into the flat buffer, divided and copied back: 3 passes at 1000 bytes/ms
    np.testing.assert_allclose(cost.sync_parts["copy"], [3 * 3200 / 1000] * 2 + [3 * 6400 / 1000] * 2)
    slowest = 12800 / 2000 + 1.0 + 3 * 6400 / 1000
    assert cost.sync_ms_per_step == pytest.approx(slowest / 4)
    assert cost.step_ms == pytest.approx(cost.group_step_ms + slowest / 4)
    # the group's own step: its plan on 2 ranks, at the same profile, both groups' ranks sharing the host
    alone = CostModel(Topology(world_size=2, compute_device="cpu", batch_size=4, profile=PROFILE), "sgd", 0.0,
                      collect_tables(TABLES, 4), host_copies=2).evaluate(PLAN, collect_tables(TABLES, 4))
    assert cost.group_step_ms == pytest.approx(alone.step_time_ms)
    assert cost.memory_bytes.tolist() == pytest.approx(sum(alone.memory.values()).tolist())


def test_more_than_two_replicas_sync_around_a_ring_with_their_optimizer_state():
    world = Topology(world_size=4, compute_device="cpu", batch_size=4, profile=PROFILE)
    plan = ShardingPlan({"": {name: ParameterSharding("table_wise", ranks=[0],
                                                      shards=[ShardMetadata.on_rank(0, 0, 0, 100, 8)])
                              for name in ("t", "d")}})
    cost = price_two_dimensional(plan, TABLES, world, 1, optimizer="row_wise_adagrad", batch_size=4)
    # one group of 1 rank, 4 replicas: each rank holds both tables (3,200 bytes) and their row-wise state (400),
    # all-reduced around the ring 0 -> 1 -> 2 -> 3 -> 0: 3 of 4 chunks to the next rank in each phase
    assert cost.replicas == 4
    sent = 2 * 2 * 3 / 4 * (3200 + 400)
    assert cost.sync_traffic.tolist() == [[0, sent, 0, 0], [0, 0, sent, 0], [0, 0, 0, sent], [sent, 0, 0, 0]]
    assert cost.sync_bytes.tolist() == [sent] * 4
    np.testing.assert_allclose(cost.sync_parts["latency"], [1.0] * 4)  # one float32 all-reduce
    np.testing.assert_allclose(cost.sync_parts["bytes"], [2 * sent / 2000] * 4)  # sent and received
    without_state = price_two_dimensional(plan, TABLES, world, 1, optimizer="row_wise_adagrad", batch_size=4,
                                          include_optimizer_state=False)
    assert without_state.sync_bytes.tolist() == [2 * 2 * 3 / 4 * 3200] * 4


def test_the_plain_model_has_no_sync_and_a_plan_beyond_the_group_is_refused():
    world = Topology(world_size=2, compute_device="cpu", batch_size=4, profile=PROFILE)
    cost = price_two_dimensional(PLAN, TABLES, world, 2, batch_size=4)
    assert cost.replicas == 1 and cost.sync_ms_per_step == 0.0 and not cost.sync_bytes.any()
    plain = CostModel(world, "sgd", 0.0, collect_tables(TABLES, 4)).evaluate(PLAN, collect_tables(TABLES, 4))
    assert cost.step_ms == pytest.approx(plain.step_time_ms)
    with pytest.raises(ValueError, match=r"table 't' \(module ''\) is placed on ranks \[1\], outside the sharding "
                                         r"group's ranks 0..0"):
        price_two_dimensional(PLAN, TABLES, world, 1, batch_size=4)
    with pytest.raises(ValueError, match="sync_interval must be an int >= 1"):
        price_two_dimensional(PLAN, TABLES, world, 2, sync_interval=0)


def test_local_ranks_of_every_copy_share_the_hosts_cores():
    profile = CalibrationProfile(collectives=PAIRS, read_curve=((1e3, 100.0), (1e6, 10.0)),
                                 write_bytes_per_ms=1000.0, memory_parallelism=4.0)
    topology = Topology(world_size=2, compute_device="cpu", profile=profile, cores_per_host=2)
    # one copy: 2 ranks on 2 cores share nothing; two copies: 4 ranks on 2 cores, the busiest rank gets its own
    # work and (4 / 2 - 1) / 3 of the other three's (1 + 3 + 3 + 1 - 3)
    assert CostModel(topology)._phase_ms(np.array([3.0, 1.0])) == pytest.approx(3.0)
    assert CostModel(topology, host_copies=2)._phase_ms(np.array([3.0, 1.0])) == pytest.approx(3.0 + 5.0 / 3)
    with pytest.raises(ValueError, match="host_copies must be an int >= 1, got 0"):
        CostModel(topology, host_copies=0)
    # GPU ranks read their own device's memory: other groups on the host do not slow their lookups
    gpus = Topology(world_size=2, compute_device="cuda", profile=CalibrationProfile(
        collectives=PAIRS, read_curve=((1e3, 100.0), (1e6, 10.0)), write_bytes_per_ms=1000.0, memory_parallelism=2.0))
    assert CostModel(gpus.replace(compute_device="cpu"), host_copies=2)._phase_ms(np.array([3.0, 1.0])) > 3.0
    assert CostModel(gpus, host_copies=2)._phase_ms(np.array([3.0, 1.0])) == \
        CostModel(gpus)._phase_ms(np.array([3.0, 1.0]))


# ---- choosing the group size -----------------------------------------------------------------------------------
def test_compare_sharding_group_sizes_plans_each_size_and_says_which_do_not_fit():
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16, feature_names=[f"f{i}"])
              for i in range(4)]  # 64,000 bytes each; with SGD nothing else but buffers
    world = Topology(world_size=4, compute_device="cpu", ddr_cap=150_000, profile=PROFILE)
    frame = compare_sharding_group_sizes(tables, world, batch_size=8)
    assert frame["sharding_group_size"].tolist() == [1, 2, 4]
    assert frame["replicas"].tolist() == [4, 2, 1]
    # one rank cannot hold 256,000 bytes of tables in 150,000
    assert frame["fits"].tolist() == [False, True, True]
    assert frame["why"][0].startswith("tables t2, t3 do not fit: rank 0 is") and frame["why"][1:].tolist() == ["", ""]
    fits = frame[frame["fits"]]
    assert fits["sync_bytes_per_sync"].tolist() == [2 * 64000.0, 0.0]  # G=2: two tables a rank, half each way
    assert fits["max_memory_bytes"].tolist()[0] > fits["max_memory_bytes"].tolist()[1]
    # G = W is the plain model: the planner's own plan and step estimate on the world's topology
    planner = EmbeddingShardingPlanner(world, batch_size=8)
    plan = planner.plan(tables)
    plain = CostModel(world.with_batch_size(8), "sgd", 0.0, collect_tables(tables, 8)).evaluate(
        plan, collect_tables(tables, 8))
    assert frame["step_ms"].tolist()[2] == pytest.approx(plain.step_time_ms)
    assert frame["plan"][2] == plan


# ---- against a real DMPCollection on 4 gloo ranks ---------------------------------------------------------------
ROWS = {"a": 30, "b": 40, "c": 24}
DIM = 8


def _group_plan() -> rtk.ShardingPlan:
    return rtk.ShardingPlan({"ebc": {"a": table_wise(1, ROWS["a"], DIM), "b": row_wise([0, 1], ROWS["b"], DIM),
                                     "c": column_wise([(0, 4), (1, 4)], ROWS["c"])}})


def _tables():
    return [rtk.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=DIM, feature_names=[f"f{n}"])
            for n, r in ROWS.items()]


def _one_rank_plan() -> rtk.ShardingPlan:
    return rtk.ShardingPlan({"ebc": {n: table_wise(0, r, DIM) for n, r in ROWS.items()}})


def _dmp_worker(rank: int, world_size: int, contiguous: bool, group_size: int) -> None:
    from rectoolkit.distributed import DMPCollection
    from dist_harness import make_batch

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.ebc = rtk.EmbeddingBagCollection(_tables(), optimizer="row_wise_adagrad", lr=0.1)
    plan = _group_plan if group_size == 2 else _one_rank_plan
    dmp = DMPCollection(model, torch.device("cpu"), plan(), world_size=4, sharding_group_size=group_size,
                        global_pg=dist.group.WORLD, use_inter_host_allreduce=contiguous)
    dmp.module.ebc(make_batch({f"f{n}": r for n, r in ROWS.items()}, 4, seed=rank)).values().sum().backward()
    before = [w.detach().clone() for _, _, w, _ in dmp.sharded_modules["ebc"].local_shards()]
    dmp.sync()
    gathered = [None] * dist.get_world_size(dmp.env.replica_pg)
    dist.all_gather_object(gathered, before, group=dmp.env.replica_pg)
    for i, (_, _, weight, _) in enumerate(dmp.sharded_modules["ebc"].local_shards()):  # the replicas' mean
        torch.testing.assert_close(weight, sum(g[i] for g in gathered) / len(gathered))
    world = Topology(world_size=4, compute_device="cpu", batch_size=4, profile=PROFILE)
    cost = price_two_dimensional(plan(), model, world, group_size, use_inter_host_allreduce=contiguous,
                                 optimizer="row_wise_adagrad", batch_size=4)
    usage, position = dmp.memory_usage(), dmp.env.rank
    assert usage["embedding_weights"] == cost.group.memory["weights"][position]
    assert usage["embedding_optimizer"] == cost.group.memory["optimizer"][position]
    # what sync() sent to the other replica, and how many collectives it called
    sent = dmp.sync_env.stats.bytes_sent["sync_allreduce"].copy()
    sent[dmp.sync_env.rank] = 0
    assert int(sent.sum()) == cost.sync_bytes[rank]
    assert dmp.sync_env.stats.calls["sync_allreduce"] == cost.sync_parts["latency"][rank] / PAIRS["all_reduce"].alpha_ms


@pytest.mark.parametrize("contiguous, group_size", [(False, 2), (True, 2), (False, 1)])
def test_the_estimate_has_a_real_dmp_collections_memory_sync_bytes_and_calls(contiguous, group_size):
    run_workers(_dmp_worker, 4, contiguous, group_size)


def test_a_sync_of_more_ranks_than_cores_shares_them():
    quiet = price_two_dimensional(PLAN, TABLES, Topology(world_size=4, compute_device="cpu", profile=PROFILE), 2,
                                  batch_size=4)
    shared = price_two_dimensional(PLAN, TABLES, Topology(world_size=4, compute_device="cpu", profile=PROFILE,
                                                          cores_per_host=2), 2, batch_size=4)
    assert not quiet.sync_parts["shared_cores"].any()
    own = quiet.sync_parts["latency"] + quiet.sync_parts["bytes"] + quiet.sync_parts["copy"]
    np.testing.assert_allclose(shared.sync_parts["shared_cores"], own)  # 4 ranks on 2 cores: all of it again
    np.testing.assert_allclose(shared.sync_ms, 2 * own)
