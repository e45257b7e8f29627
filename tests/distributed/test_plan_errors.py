"""Plans that cannot run are refused at construction, with the table, the shards and the fix in the message."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection, shard_embedding_collection
from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from dist_harness import column_wise, row_wise, table_wise


def _ebc():
    return rtk.EmbeddingBagCollection([
        rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=8, feature_names=["f0"]),
        rtk.EmbeddingBagConfig(name="t1", num_embeddings=6, embedding_dim=4, feature_names=["f1"])])


def _two_ranks(local_world_size=2):
    return ShardingEnv(rank=0, world_size=2, local_world_size=local_world_size)  # no communication at construction


def test_missing_table():
    with pytest.raises(ValueError, match=r"plan for other tables: no entry for \['t1'\]"):
        shard_embedding_bag_collection(_ebc(), {"t0": table_wise(0, 10, 8)}, ShardingEnv.local())


def test_shards_must_tile_the_table():
    plan = {"t0": row_wise([0], 10, 8), "t1": ParameterSharding("row_wise", shards=[ShardMetadata.on_rank(0, 0, 0, 5, 4)])}
    with pytest.raises(ValueError, match="table t1 do not tile it exactly: rows 5..6 of columns 0..4 are in no shard"):
        shard_embedding_bag_collection(_ebc(), plan, ShardingEnv.local())


def test_shard_on_a_rank_outside_the_world():
    plan = {"t0": table_wise(3, 10, 8), "t1": table_wise(0, 6, 4)}
    with pytest.raises(ValueError, match="placed on rank 3 but the world size is 2"):
        shard_embedding_bag_collection(_ebc(), plan, _two_ranks())


def test_shape_must_match_the_type():
    plan = {"t0": ParameterSharding("table_wise", shards=column_wise([(0, 4), (1, 4)], 10).shards),
            "t1": table_wise(0, 6, 4)}
    with pytest.raises(ValueError, match="'t0' is planned table_wise but it has more than one shard"):
        shard_embedding_bag_collection(_ebc(), plan, _two_ranks())


def test_table_row_wise_stays_in_one_host():
    plan = {"t0": row_wise([0, 1], 10, 8, kind="table_row_wise"), "t1": table_wise(0, 6, 4)}
    with pytest.raises(ValueError, match=r"row blocks sit on hosts \[0, 1\] \(local_world_size=1\)"):
        shard_embedding_bag_collection(_ebc(), plan, _two_ranks(local_world_size=1))


def test_table_column_wise_stays_in_one_host():
    plan = {"t0": column_wise([(0, 4), (1, 4)], 10, kind="table_column_wise"), "t1": table_wise(0, 6, 4)}
    with pytest.raises(ValueError, match=r"t0.*column blocks sit on hosts \[0, 1\] \(local_world_size=1\)"):
        shard_embedding_bag_collection(_ebc(), plan, _two_ranks(local_world_size=1))
    shard_embedding_bag_collection(_ebc(), plan, _two_ranks(local_world_size=2))  # one host of 2 ranks: fine


def test_sequence_column_shards_of_one_rank_share_a_width():
    ec = rtk.EmbeddingCollection([rtk.EmbeddingConfig(name="e", num_embeddings=10, embedding_dim=8, feature_names=["g"])])
    with pytest.raises(ValueError, match=r"column shards of widths \[2, 6\]"):
        shard_embedding_collection(ec, {"e": column_wise([(0, 2), (0, 6)], 10)}, ShardingEnv.local())


def test_out_of_range_id_names_feature_table_and_rank():
    sharded = shard_embedding_bag_collection(_ebc(), {"t0": row_wise([0], 10, 8), "t1": table_wise(0, 6, 4)},
                                             ShardingEnv.local())
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], torch.tensor([1, 6]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match=r"rank 0: id 6 of feature 'f1' \(sample \d+\) is out of range for table 't1'"):
        sharded(kjt)


def test_weights_of_the_unsharded_module_are_kept():
    ebc = _ebc()
    plan = {"t0": row_wise([0], 10, 8), "t1": column_wise([(0, 2), (0, 2)], 6)}
    sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    for table, shard, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard.rows, shard.columns
        assert torch.equal(weight, ebc.embedding_bags[table].weight[r0:r1, c0:c1])
    held = 4 * (10 * 8 + 6 * 4)
    assert sharded.memory_bytes() == {"weights": held, "optimizer": 0, "host": held, "device": 0}  # all on CPU
