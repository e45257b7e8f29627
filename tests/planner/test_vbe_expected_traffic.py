"""The planner's expected traffic for features with their own batch sizes (ParameterConstraints.batch_sizes that
differ within a collection): priced as the engine sends a VBE batch with those sizes (rectoolkit.plan.traffic),
i.e. equal to step_traffic over a real VBE batch whose ids fall exactly as expected, and to hand-worked numbers;
equal batch sizes keep the plain figures."""

import dataclasses

import numpy as np
import pytest
import torch

from rectoolkit.modules.configs import EmbeddingBagConfig, EmbeddingConfig
from rectoolkit.plan.traffic import COLLECTIVES, batch_id_counter, batch_sizes_of, step_traffic
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.planner.constraints import ParameterConstraints
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.enumerate import enumerate_options, to_parameter_sharding
from rectoolkit.planner.profile import AlphaBeta, CalibrationProfile
from rectoolkit.planner.state import Assignment, SearchState
from rectoolkit.planner.tables import collect_tables
from rectoolkit.planner.topology import Topology
from rectoolkit.sparse import KeyedJaggedTensor

W, L, ROWS, DIM = 4, 2, 12, 8
TOPOLOGY = Topology(world_size=W, local_world_size=L, compute_device="cpu", batch_size=4,
                    intra_host_bw=100.0, inter_host_bw=10.0)
# table -> {feature: (samples per rank, ids per sample)}: 4 "user" ids, 12 "item" ids, 4 "ctx" ids per rank, so every
# row block of 3 (row-wise over 4 ranks), 6 (over a host) or 12 rows expects a whole number of them
BAGS = {"t": {"user": (2, 2), "item": (4, 3)}, "u": {"ctx": (4, 1)}}
SEQS = {"s": {"q": (1, 4), "d": (4, 1)}}


def shard(rank, row_offset, col_offset, rows, cols):
    return ShardMetadata.on_rank(rank, row_offset, col_offset, rows, cols)


def blocks(kind, ranks_cols):
    """ParameterSharding of column blocks (cols, ranks): each block split into equal row blocks over its ranks."""
    shards, col = [], 0
    for cols, ranks in ranks_cols:
        rows = ROWS // len(ranks)
        shards += [shard(r, k * rows, col, rows, cols) for k, r in enumerate(ranks)]
        col += cols
    return ParameterSharding(kind, ranks=sorted({s.rank for s in shards}), shards=shards)


PLANS = {
    "table_wise": {"t": blocks("table_wise", [(8, [1])]), "u": blocks("table_wise", [(8, [2])]),
                   "s": blocks("table_wise", [(8, [3])])},
    "column_wise": {"t": blocks("column_wise", [(4, [0]), (4, [3])]), "u": blocks("column_wise", [(4, [2]), (4, [1])]),
                    "s": blocks("column_wise", [(4, [1]), (4, [1])])},
    "row_wise": {name: blocks("row_wise", [(8, [0, 1, 2, 3])]) for name in ("t", "u", "s")},
    "table_row_wise": {"t": blocks("table_row_wise", [(8, [2, 3])]), "u": blocks("table_row_wise", [(8, [0, 1])]),
                       "s": blocks("table_row_wise", [(8, [2, 3])])},
    # u: both column blocks on host 1 (its ranks hear one count header per feature, not one per block)
    "grid_shard": {"t": blocks("grid_shard", [(4, [0, 1]), (4, [2, 3])]),
                   "u": blocks("grid_shard", [(4, [2, 3]), (4, [2, 3])]),
                   "s": blocks("table_row_wise", [(8, [0, 1])])},
}


def configs(spec, kind):
    return [kind(name=name, num_embeddings=ROWS, embedding_dim=DIM, feature_names=list(features))
            for name, features in spec.items()]


def constraints(spec, equal_batches=False):
    return {name: ParameterConstraints(pooling_factors=[float(ids) for _, ids in features.values()],
                                       batch_sizes=[4 if equal_batches else samples for samples, _ in features.values()])
            for name, features in spec.items()}


def spread_batch(spec, vbe=True):
    """One rank's batch: every sample of a feature has its ids per sample, and a feature's n ids are the rows
    k * ROWS // n (k < n), so a row block of r rows holds exactly n * r / ROWS of them. vbe=False: 4 samples each."""
    features = {f: (samples if vbe else 4, ids) for table in spec.values() for f, (samples, ids) in table.items()}
    keys = list(features)
    strides = [samples for samples, _ in features.values()]
    lengths = torch.tensor([ids for samples, ids in features.values() for _ in range(samples)])
    values = torch.cat([torch.arange(samples * ids) * ROWS // (samples * ids) for samples, ids in features.values()])
    if not vbe:
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
    inverse = torch.stack([torch.arange(4) % s for s in strides])
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, stride_per_key_per_rank=[[s] for s in strides],
                             inverse_indices=(keys, inverse))


def planner_and_engine(spec, kind, case, equal_batches=False):
    """(the planner's expected matrices, step_traffic's over one real batch per rank) for the case's plan."""
    tables = configs(spec, kind)
    plan = {name: ps for name, ps in PLANS[case].items() if name in spec}
    planner_tables = collect_tables(tables, TOPOLOGY.batch_size, constraints(spec, equal_batches))
    expected = CostModel(TOPOLOGY).traffic(ShardingPlan({"": plan}), planner_tables)
    batches = [spread_batch(spec, vbe=not equal_batches)] * W
    measured = step_traffic(plan, tables, W, L, batch_sizes_of(batches), batch_id_counter(batches))
    return expected, measured


@pytest.mark.parametrize("case", list(PLANS))
@pytest.mark.parametrize("spec,kind", [(BAGS, EmbeddingBagConfig), (SEQS, EmbeddingConfig)], ids=["bags", "sequences"])
def test_expected_equals_a_vbe_batch_with_those_sizes(case, spec, kind):
    expected, measured = planner_and_engine(spec, kind, case)
    assert any(measured[name].sum() for name in COLLECTIVES)
    for name in COLLECTIVES:
        np.testing.assert_allclose(expected[name], measured[name], rtol=1e-12, err_msg=f"{case}: {name}")


@pytest.mark.parametrize("case", list(PLANS))
@pytest.mark.parametrize("spec,kind", [(BAGS, EmbeddingBagConfig), (SEQS, EmbeddingConfig)], ids=["bags", "sequences"])
def test_equal_batch_sizes_price_a_plain_batch(case, spec, kind):
    """batch_sizes equal for every feature: the figures of no batch_sizes at all, a plain batch's on the wire."""
    expected, measured = planner_and_engine(spec, kind, case, equal_batches=True)
    tables = configs(spec, kind)
    plain = {name: ParameterConstraints(pooling_factors=c.pooling_factors)
             for name, c in constraints(spec).items()}
    plan = {name: ps for name, ps in PLANS[case].items() if name in spec}
    default = CostModel(TOPOLOGY).traffic(ShardingPlan({"": plan}), collect_tables(tables, 4, plain))
    for name in COLLECTIVES:
        np.testing.assert_allclose(expected[name], measured[name], rtol=1e-12, err_msg=f"{case}: {name}")
        np.testing.assert_array_equal(expected[name], default[name], err_msg=f"{case}: {name}")


def test_table_wise_by_hand():
    m, _ = planner_and_engine(BAGS, EmbeddingBagConfig, "table_wise")
    # to rank 1 (t): user 4 B count + 2 lengths * 4 B + 4 ids * 8 B = 44, item 4 + 16 + 12 * 8 = 116;
    # to rank 2 (u): ctx 4 + 16 + 4 * 8 = 52
    assert m["input_dist"].tolist() == [[0, 160, 52, 0]] * 4
    # pooled rows at each feature's own batch: t (2 + 4) x 8 fp32 = 192 B, u 4 x 8 fp32 = 128 B to every rank
    assert m["output_dist"].tolist() == [[0] * 4, [192] * 4, [128] * 4, [0] * 4]
    seq, _ = planner_and_engine(SEQS, EmbeddingConfig, "table_wise")
    # sequences: lengths padded to the collection's 4 samples, no count: q 16 + 4 ids * 8, d 16 + 4 * 8
    assert seq["input_dist"].tolist() == [[0, 0, 0, 96]] * 4
    assert seq["output_dist"].tolist() == [[0] * 4, [0] * 4, [0] * 4, [256] * 4]  # 8 ids x 8 fp32 per rank


def test_table_row_wise_by_hand():
    m, _ = planner_and_engine({"t": BAGS["t"]}, EmbeddingBagConfig, "table_row_wise")
    # t on host 1, 6 rows on each of ranks 2, 3: user 4 + 8 + 2 ids * 8 = 28, item 4 + 16 + 6 * 8 = 68 to each;
    # and one count per feature (8 B) to the gateway on host 1 with the sender's local index (itself on host 1)
    assert m["input_dist"].tolist() == [[0, 0, 104, 96], [0, 0, 96, 104], [0, 0, 104, 96], [0, 0, 96, 104]]
    # partial sums (2 + 4 samples) x 8 fp32 = 192 B per destination, to its gateway on host 1
    assert m["output_dist_intra"].tolist() == [[0] * 4, [0] * 4, [0, 0, 384, 384], [0, 0, 384, 384]]
    assert m["output_dist_inter"].tolist() == [[0] * 4, [0] * 4, [192, 0, 192, 0], [0, 192, 0, 192]]


def test_no_more_collective_calls_than_one_batch_size():
    """The engine sends one all-to-all per sharding-type group whatever the batch sizes: same groups, same
    latency (1 ms a call here); only the bytes differ."""
    base = CalibrationProfile.from_topology(TOPOLOGY)
    profile = dataclasses.replace(base, collectives={kind: AlphaBeta(1.0, pair.bytes_per_ms)
                                                     for kind, pair in base.collectives.items()})
    model = CostModel(dataclasses.replace(TOPOLOGY, profile=profile))
    tables = configs(BAGS, EmbeddingBagConfig)
    plan = ShardingPlan({"": {name: PLANS["grid_shard"][name] for name in BAGS}})
    vbe = model.evaluate(plan, collect_tables(tables, 4, constraints(BAGS)))
    plain = model.evaluate(plan, collect_tables(tables, 4, constraints(BAGS, equal_batches=True)))
    # one grid group: input_dist (metadata + data), two output levels forward and backward: 6 calls
    assert [(g.sharding_type, g.latency_ms) for g in vbe.step.groups] == [("grid_shard", 6.0)]
    assert [(g.sharding_type, g.latency_ms) for g in plain.step.groups] == [("grid_shard", 6.0)]
    assert vbe.total_bytes != plain.total_bytes


def test_search_prices_vbe_sequences_as_evaluate():
    """The search's closed forms (lengths padded to the collection's batch) equal evaluate() on a VBE sequence
    collection, for every option of its table at its first placement."""
    topology = dataclasses.replace(TOPOLOGY, compute_device="cuda", hbm_mem_bw=5000.0, ddr_mem_bw=3000.0,
                                   hbm_to_ddr_mem_bw=800.0)
    table = collect_tables(configs(SEQS, EmbeddingConfig), 4, constraints(SEQS))[0]
    assert table.lengths_per_rank == 2 * 4  # two features padded to 4 samples, not 1 + 4
    model = CostModel(topology)
    options = enumerate_options(table, 0, topology)
    for option in options:
        model.fill_many([option], [table])
        state = SearchState(topology)
        locations = (0,) * (0 if option.kind == "fixed" else option.num_groups)
        state.apply(Assignment(option, locations))
        cost = model.evaluate(ShardingPlan({"": {"s": to_parameter_sharding(option, table, locations, topology)}}),
                              [table])
        np.testing.assert_allclose(state.time, cost.time_ms, rtol=1e-9, err_msg=option.label)
        assert state.total_bytes == pytest.approx(cost.total_bytes, rel=1e-9), option.label
    assert {o.kind for o in options} >= {"rank", "fixed"}
