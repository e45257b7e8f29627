"""TABLE_COLUMN_WISE against TorchRec 1.8: its planner's shard layout, its sharded EmbeddingBagCollection's outputs
on 2 ranks (gloo), and our byte estimate (the equivalence and byte tests of every type, TABLE_COLUMN_WISE among
them, are in test_sharded_equivalence.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import rectoolkit as rtk
from rectoolkit.plan.torchrec_interop import from_torchrec, to_torchrec
from rectoolkit.plan.traffic import step_traffic
from dist_harness import column_wise, run_workers

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

TABLES = [("a", 1000, 256), ("b", 300, 256), ("c", 50, 256)]


def _plans(world_size, local_world_size):
    only_twcw = {"sharding_types": ["table_column_wise"], "min_partition": 128}
    ours = rtk.EmbeddingShardingPlanner(
        rtk.Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cpu"),
        constraints={n: rtk.ParameterConstraints(**only_twcw) for n, _, _ in TABLES},
    ).plan(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d,
                                                              feature_names=[n + "_f"]) for n, r, d in TABLES],
                                      device=torch.device("meta")))
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    theirs = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cpu"),
        constraints={n: ParameterConstraints(**only_twcw) for n, _, _ in TABLES},
    ).plan(torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name=n, num_embeddings=r, embedding_dim=d, feature_names=[n + "_f"]) for n, r, d in TABLES],
        device=torch.device("meta")), [EmbeddingBagCollectionSharder()])
    return ours, theirs


@pytest.mark.parametrize("world_size,local_world_size", [(4, 2), (2, 1), (2, 2)])
def test_planner_lays_out_shards_as_torchrecs(world_size, local_world_size):
    ours, theirs = _plans(world_size, local_world_size)
    for name, _, _ in TABLES:
        mine, their = ours.plan[""][name], theirs.plan[""][name]
        assert (mine.sharding_type, mine.compute_kernel) == (their.sharding_type, their.compute_kernel) \
            == ("table_column_wise", "fused")
        assert [(s.shard_offsets, s.shard_sizes, s.placement) for s in mine.shards] == \
            [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in their.sharding_spec.shards]
        assert len({s.rank // local_world_size for s in mine.shards}) == 1  # one host
    # and the plan goes to TorchRec and back unchanged
    assert from_torchrec(to_torchrec(ours)).plan == ours.plan


def test_bytes_are_column_wises():
    """A TABLE_COLUMN_WISE plan moves exactly the bytes of the COLUMN_WISE plan with the same shards: 4 B_i + 8 per
    id to each block's owner, 4 B_i x block columns back (hand-worked for one block below)."""
    config = rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])
    blocks = [(1, 4), (1, 4)]  # both blocks on rank 1 (a host of its own with local_world_size=1)
    counts = lambda rank, feature, lo, hi: 3.0  # noqa: E731  3 ids per rank

    def traffic(kind):
        return step_traffic({"t": column_wise(blocks, 10, kind=kind)}, [config], 2, 1, [2, 2], counts)

    twcw, cw = traffic("table_column_wise"), traffic("column_wise")
    assert set(twcw) == set(cw) and all(np.array_equal(twcw[k], cw[k]) for k in cw)
    per_block_in = 4 * 2 + 8 * 3
    assert twcw["input_dist"].tolist() == [[0, 2 * per_block_in], [0, 2 * per_block_in]]
    assert twcw["output_dist"].tolist() == [[0, 0], [2 * 4 * 2 * 4, 2 * 4 * 2 * 4]]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_outputs_equal_torchrecs_sharded_collection(tmp_path):
    from dist_twcw_workers import torchrec_and_ours_worker

    # column blocks of 4 (TorchRec's fused kernel needs local columns divisible by 4)
    plans = [(2, {"t": ("table_column_wise", [(1, 4), (0, 4)]), "u": ("table_column_wise", [(0, 4), (1, 4)])}),
             (1, {"t": ("table_column_wise", [(1, 4), (1, 4)]), "u": ("column_wise", [(0, 4), (1, 4)])})]
    out = tmp_path / "results.json"
    run_workers(torchrec_and_ours_worker, 2, plans, str(out))
    results = json.loads(out.read_text())
    assert len(results) == 4 and {r["rank"] for r in results} == {0, 1}
    for r in results:
        assert r["shape"] == [3 + r["rank"], 8 + 8 + 8]  # features f, f2 (table t) and g (table u), 8 wide each
        assert r["torchrec_vs_ours"] <= 1e-6, r
        assert r["ours_vs_unsharded"] <= 1e-6, r


def test_sharding_type_members_are_torchrecs_in_order():
    from torchrec.distributed.types import ShardingType as TorchRecShardingType

    assert [m.value for m in rtk.ShardingType] == [m.value for m in TorchRecShardingType]
    assert rtk.ShardingType.parse(TorchRecShardingType.TABLE_COLUMN_WISE) is rtk.ShardingType.TABLE_COLUMN_WISE
