"""The cost model: hand-computed bytes per sharding type, memory by hand, and the search's closed forms
equal to pricing rectoolkit.plan.traffic's matrices."""

import dataclasses
import itertools

import numpy as np
import pytest

from rectoolkit.distributed.fbgemm_qcomm_codec import CommOp, CommType, QCommsConfig, get_qcomm_codecs_registry
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder
from rectoolkit.modules.configs import DataType, EmbeddingBagConfig, EmbeddingConfig
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardingType, ShardMetadata
from rectoolkit.planner.constraints import ParameterConstraints
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.enumerate import enumerate_options, to_parameter_sharding
from rectoolkit.planner.profile import AlphaBeta, CalibrationProfile
from rectoolkit.planner.state import Assignment, SearchState
from rectoolkit.planner.tables import apply_sharders, collect_tables
from rectoolkit.planner.topology import Topology


def shard(rank, row_offset, col_offset, rows, cols):
    return ShardMetadata([row_offset, col_offset], [rows, cols], f"rank:{rank}/cpu")


# One table of 12 rows x 8 columns, one feature, 2 samples per rank, 2 ids per sample (expected ids are
# spread evenly over rows), 4 ranks on 2 hosts: {0, 1} and {2, 3}.
TOPOLOGY = Topology(world_size=4, local_world_size=2, compute_device="cpu", batch_size=2,
                    intra_host_bw=100.0, inter_host_bw=10.0)


def traffic_of(table_config, ps, weighted=False):
    constraints = {"t": ParameterConstraints(pooling_factors=[2.0], is_weighted=weighted)}
    tables = collect_tables([table_config], batch_size=2, constraints=constraints)
    plan = ShardingPlan({"": {"t": ps}})
    return CostModel(TOPOLOGY).traffic(plan, tables), CostModel(TOPOLOGY).evaluate(plan, tables)


BAG = EmbeddingBagConfig(name="t", num_embeddings=12, embedding_dim=8, feature_names=["f"])
SEQ = EmbeddingConfig(name="t", num_embeddings=12, embedding_dim=8, feature_names=["f"])
Z = [[0, 0, 0, 0]] * 4


def test_table_wise_bytes_by_hand():
    m, cost = traffic_of(BAG, ParameterSharding("table_wise", ranks=[1], shards=[shard(1, 0, 0, 12, 8)]))
    # every rank sends rank 1: 2 lengths * 4 B + 4 ids * 8 B = 40 B; rank 1 returns [2, 8] fp32 = 64 B to each
    assert m["input_dist"].tolist() == [[0, 40, 0, 0]] * 4
    assert m["output_dist"].tolist() == [[0, 0, 0, 0], [64, 64, 64, 64], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert m["output_dist_backward"].tolist() == np.array(m["output_dist"]).T.tolist()
    assert m["dp_allreduce"].tolist() == Z
    # rank 1's comm time: 40 B from rank 0 at 100 B/ms, 40 B from ranks 2 and 3 at 10 B/ms
    assert cost.comm_ms["input_dist"][1] == pytest.approx(40 / 100 + 80 / 10)
    assert cost.comm_ms["output_dist"][1] == pytest.approx(64 / 100 + 128 / 10)
    assert cost.comm_ms["input_dist"][0] == pytest.approx(40 / 100)
    assert cost.comm_ms["output_dist_backward"][3] == pytest.approx(64 / 10)


def test_weighted_table_wise_bytes_by_hand():
    m, _ = traffic_of(BAG, ParameterSharding("table_wise", ranks=[1], shards=[shard(1, 0, 0, 12, 8)]), weighted=True)
    assert m["input_dist"].tolist() == [[0, 56, 0, 0]] * 4  # 8 + 4 ids * (8 + 4)


def test_row_wise_bytes_by_hand():
    shards = [shard(r, 3 * r, 0, 3, 8) for r in range(4)]
    m, _ = traffic_of(BAG, ParameterSharding("row_wise", ranks=[0, 1, 2, 3], shards=shards))
    # each row block holds 1 of each rank's 4 ids: 8 B lengths + 8 B ids; partial sums [2, 8] fp32 back
    assert m["input_dist"].tolist() == [[16] * 4] * 4
    assert m["output_dist"].tolist() == [[64] * 4] * 4
    assert m["output_dist_intra"].tolist() == Z


def test_column_wise_bytes_by_hand():
    shards = [shard(0, 0, 0, 12, 4), shard(3, 0, 4, 12, 4)]
    m, _ = traffic_of(BAG, ParameterSharding("column_wise", ranks=[0, 3], shards=shards))
    assert m["input_dist"].tolist() == [[40, 0, 0, 40]] * 4
    assert m["output_dist"].tolist() == [[32] * 4, [0] * 4, [0] * 4, [32] * 4]


def test_table_row_wise_bytes_by_hand():
    shards = [shard(2, 0, 0, 6, 8), shard(3, 6, 0, 6, 8)]
    m, _ = traffic_of(BAG, ParameterSharding("table_row_wise", ranks=[2, 3], shards=shards))
    # 2 of 4 ids per row block: 8 + 16 = 24 B to each of ranks 2 and 3
    assert m["input_dist"].tolist() == [[0, 0, 24, 24]] * 4
    # partial sums for destinations 0, 2 go to gateway 2, for 1, 3 to gateway 3: 2 x 64 B each
    assert m["output_dist_intra"].tolist() == [[0] * 4, [0] * 4, [0, 0, 128, 128], [0, 0, 128, 128]]
    # reduced [2, 8] from the gateway with the destination's local index: 2 -> {0, 2}, 3 -> {1, 3}
    assert m["output_dist_inter"].tolist() == [[0] * 4, [0] * 4, [64, 0, 64, 0], [0, 64, 0, 64]]
    assert m["output_dist"].tolist() == Z


def test_grid_shard_bytes_by_hand():
    shards = [shard(0, 0, 0, 6, 4), shard(1, 6, 0, 6, 4), shard(2, 0, 4, 6, 4), shard(3, 6, 4, 6, 4)]
    m, _ = traffic_of(BAG, ParameterSharding("grid_shard", ranks=[0, 1, 2, 3], shards=shards))
    assert m["input_dist"].tolist() == [[24] * 4] * 4
    assert m["output_dist_intra"].tolist() == [[64, 64, 0, 0], [64, 64, 0, 0], [0, 0, 64, 64], [0, 0, 64, 64]]
    assert m["output_dist_inter"].tolist() == [[32, 0, 32, 0], [0, 32, 0, 32], [32, 0, 32, 0], [0, 32, 0, 32]]


def test_data_parallel_bytes_by_hand():
    shards = [shard(r, 0, 0, 12, 8) for r in range(4)]
    m, _ = traffic_of(BAG, ParameterSharding("data_parallel", "dense", ranks=[0, 1, 2, 3], shards=shards))
    # 96 gradient values in 4 chunks of 24, all-reduced around a ring: each rank sends the next one 3 chunks in the
    # reduce-scatter and 3 in the all-gather, 4 B * 144, and no other rank anything
    assert m["dp_allreduce"].tolist() == [[0, 576, 0, 0], [0, 0, 576, 0], [0, 0, 0, 576], [576, 0, 0, 0]]
    assert m["input_dist"].tolist() == Z


def test_sequence_table_wise_bytes_by_hand():
    m, _ = traffic_of(SEQ, ParameterSharding("table_wise", ranks=[1], shards=[shard(1, 0, 0, 12, 8)]))
    assert m["input_dist"].tolist() == [[0, 40, 0, 0]] * 4
    assert m["output_dist"].tolist() == [[0] * 4, [128] * 4, [0] * 4, [0] * 4]  # 4 ids x 8 fp32 per rank


def test_memory_by_hand():
    topo = Topology(world_size=2, compute_device="cuda", batch_size=2, hbm_cap=10**9)
    t = collect_tables([EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=8, feature_names=["f"])], 2,
                       {"t": ParameterConstraints(pooling_factors=[3.0])})[0]
    model = CostModel(topo, optimizer="adam")
    parts = model.shard_memory(t, 50, 8, "row_wise", "fused", None)
    assert parts["weights"] == 50 * 8 * 4
    assert parts["optimizer"] == 50 * 8 * 4 * 2
    # ids from both ranks: 2 ranks * 2 samples * 3 ids * half the rows = 6 ids; 4 lengths
    assert parts["input_buffer"] == pytest.approx(4 * 4 + 8 * 6)
    assert parts["output_buffer"] == 4 * 8 * 4
    assert parts["ddr"] == 0 and parts["hbm"] == pytest.approx(1600 + 3200 + 64 + 128)
    uvm = model.shard_memory(t, 50, 8, "row_wise", "fused_uvm_caching", 0.25)
    assert uvm["ddr"] == 1600 + 3200 and uvm["hbm"] == pytest.approx(64 + 128 + 0.25 * 1600)
    cpu = CostModel(Topology(world_size=2, compute_device="cpu", batch_size=2), "sgd").shard_memory(t, 100, 8, "table_wise", "fused", None)
    assert cpu["hbm"] == 0 and cpu["weights"] == 3200 and cpu["optimizer"] == 0


TOPOLOGIES = [(2, 1), (4, 2), (4, 4), (6, 3), (8, 2)]


def _tables():
    bag = EmbeddingBagConfig(name="bag", num_embeddings=10, embedding_dim=16, feature_names=["a", "b"])
    half = EmbeddingBagConfig(name="half", num_embeddings=7, embedding_dim=8, feature_names=["c"], data_type=DataType.FP16)
    seq = EmbeddingConfig(name="seq", num_embeddings=9, embedding_dim=8, feature_names=["s"])
    constraints = {"bag": ParameterConstraints(pooling_factors=[2.5, 0.5], batch_sizes=[3, 5], is_weighted=True,
                                               min_partition=4, compute_kernels=["fused", "fused_uvm", "fused_uvm_caching", "dense"]),
                   "half": ParameterConstraints(pooling_factors=[4.0], min_partition=4),
                   "seq": ParameterConstraints(pooling_factors=[3.0], min_partition=4)}
    return [bag, half, seq], constraints


# every collective kind at its own speed, so a byte priced with the wrong pair shows
DISTINCT_PAIRS = CalibrationProfile(
    collectives={"all_to_all": AlphaBeta(0.1, 700.0), "all_reduce": AlphaBeta(0.2, 1400.0),
                 "reduce_scatter": AlphaBeta(0.3, 333.0), "all_gather": AlphaBeta(0.4, 5000.0)},
    read_curve=((1e3, 900.0), (1e6, 300.0)), write_bytes_per_ms=2000.0)


@pytest.mark.parametrize("world_size,local_world_size", TOPOLOGIES)
@pytest.mark.parametrize("device,profile", [("cuda", None), ("cpu", None), ("cpu", DISTINCT_PAIRS)])
def test_search_closed_forms_equal_priced_traffic(world_size, local_world_size, device, profile):
    """For every option at several placements, the search's per-rank vectors equal evaluate() of the plan."""
    topo = Topology(world_size=world_size, local_world_size=local_world_size, compute_device=device, batch_size=4,
                    intra_host_bw=700.0, inter_host_bw=90.0, hbm_mem_bw=5000.0, ddr_mem_bw=3000.0,
                    hbm_to_ddr_mem_bw=800.0, profile=profile)
    configs, constraints = _tables()
    _check_closed_forms(topo, collect_tables(configs, 4, constraints))


# quantized communication: FP16 forward / BF16 backward on every exchange; and FP16 both ways on the row-wise
# partial sums only (the other exchanges float32), so a width applied to the wrong exchange shows
QCOMM_REGISTRIES = {
    "fp16_bf16": lambda: get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.BF16)),
    "reduce_scatter_only": lambda: get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.FP16),
                                                             comm_ops=[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER]),
    "sequence_only": lambda: get_qcomm_codecs_registry(QCommsConfig(CommType.BF16, CommType.FP32),
                                                       comm_ops=[CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL]),
}


@pytest.mark.parametrize("world_size,local_world_size", [(4, 2), (6, 3)])
@pytest.mark.parametrize("registry", sorted(QCOMM_REGISTRIES))
def test_search_closed_forms_equal_priced_traffic_with_quantized_comms(world_size, local_world_size, registry):
    topo = Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cuda", batch_size=4,
                    intra_host_bw=700.0, inter_host_bw=90.0, hbm_mem_bw=5000.0, ddr_mem_bw=3000.0,
                    hbm_to_ddr_mem_bw=800.0, profile=DISTINCT_PAIRS)
    configs, constraints = _tables()
    tables = [dataclasses.replace(t, qcomm_codecs_registry=QCOMM_REGISTRIES[registry]())
              for t in collect_tables(configs, 4, constraints)]
    _check_closed_forms(topo, tables)


def test_planner_prices_the_sharders_wire_precision():
    """A sharder's registry halves the priced output bytes: table-wise "bag" on a 2-rank topology, by hand."""
    topo = Topology(world_size=2, compute_device="cuda", batch_size=4, intra_host_bw=700.0)
    table = collect_tables([EmbeddingBagConfig(name="bag", num_embeddings=10, embedding_dim=16, feature_names=["a"])],
                           4)
    sharder = EmbeddingBagCollectionSharder(
        qcomm_codecs_registry=get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.BF16)))
    halved = apply_sharders(table, [sharder], "cuda")
    plan = ShardingPlan({"": {"bag": to_parameter_sharding(
        next(o for o in enumerate_options(table[0], 0, topo) if o.sharding_type == ShardingType.TABLE_WISE),
        table[0], (1,), topo)}})
    full_bytes = CostModel(topo).traffic(plan, table)
    half_bytes = CostModel(topo).traffic(plan, halved)
    # rank 1 sends each rank [4 samples, 16 dims]: 4 bytes a value in float32, 2 at FP16 (and BF16 back)
    assert full_bytes["output_dist"][1].tolist() == [256, 256] and half_bytes["output_dist"][1].tolist() == [128, 128]
    assert half_bytes["output_dist_backward"][:, 1].tolist() == [128, 128]
    assert (half_bytes["input_dist"] == full_bytes["input_dist"]).all()


def test_measure_top_k_refuses_a_registry_it_would_not_run():
    from rectoolkit.planner.planner import EmbeddingShardingPlanner

    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=50, embedding_dim=8, feature_names=[f"f{i}"])
              for i in range(2)]
    sharder = EmbeddingBagCollectionSharder(
        qcomm_codecs_registry=get_qcomm_codecs_registry(QCommsConfig(CommType.FP16, CommType.BF16)))
    planner = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu", batch_size=4), measure_top_k=2)
    with pytest.raises(NotImplementedError, match="sharder has a qcomm_codecs_registry; plan without measure_top_k"):
        planner.plan(tables, [sharder])


def _check_closed_forms(topo, tables):
    world_size = topo.world_size
    model = CostModel(topo, optimizer="row_wise_adagrad", dense_bytes_per_rank=0)
    checked = 0
    for index, table in enumerate(tables):
        for option in enumerate_options(table, index, topo):
            model.fill_many([option], [table])
            sites = world_size if option.kind == "rank" else topo.num_hosts
            placements = [()] if option.kind == "fixed" else \
                list(itertools.islice(itertools.product(range(sites), repeat=option.num_groups), 0, None, 3))[:4]
            for locations in placements:
                state = SearchState(topo)
                state.apply(Assignment(option, tuple(locations)))
                ps = to_parameter_sharding(option, table, locations, topo)
                cost = model.evaluate(ShardingPlan({"": {table.name: ps}}), [table])
                np.testing.assert_allclose(state.time, cost.time_ms, rtol=1e-9, atol=1e-12, err_msg=option.label)
                np.testing.assert_allclose(state.hbm, cost.hbm_bytes, rtol=1e-9, err_msg=option.label)
                np.testing.assert_allclose(state.ddr, cost.ddr_bytes, rtol=1e-9, err_msg=option.label)
                assert state.total_bytes == pytest.approx(cost.total_bytes, rel=1e-9), option.label
                checked += 1
    assert checked > 20
