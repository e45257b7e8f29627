"""A KJT with a batch size per feature (VBE) through the EmbeddingCollection: as TorchRec 1.8's unsharded one, each
feature's rows come back at the feature's own batch size (the inverse indices are not applied); the sharded
collection refuses such a KJT with the fix."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_collection

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

ROWS = {"user": 10, "item": 20, "seen": 20}


def _tables(lib):
    return [lib.EmbeddingConfig(name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"]),
            lib.EmbeddingConfig(name="t_item", num_embeddings=20, embedding_dim=4, feature_names=["item", "seen"])]


def _inputs(seed, strides=(3, 1, 6), batch=6):
    """Keys seen, user, item with 3, 1 and 6 samples, inverse indices to a batch of 6."""
    g = torch.Generator().manual_seed(seed)
    keys = ["seen", "user", "item"]
    lengths = torch.randint(0, 4, (sum(strides),), generator=g)
    lengths[0] = 0  # an empty bag for sure
    per_key = lengths.split(list(strides))
    values = torch.cat([torch.randint(0, ROWS[k], (int(per_key[i].sum()),), generator=g) for i, k in enumerate(keys)])
    inverse = torch.stack([torch.randint(0, s, (batch,), generator=g) for s in strides])
    return dict(keys=keys, values=values, lengths=lengths, stride_per_key_per_rank=[[s] for s in strides],
                inverse_indices=(keys, inverse))


@pytest.mark.parametrize("need_indices", [False, True])
def test_each_feature_at_its_own_batch_size_as_torchrec(need_indices):
    ours = rtk.EmbeddingCollection(_tables(rtk), need_indices=need_indices)
    theirs = torchrec.EmbeddingCollection(tables=_tables(torchrec), need_indices=need_indices)
    theirs.load_state_dict(ours.state_dict())
    for seed in range(3):
        inputs = _inputs(seed)
        got = ours(rtk.KeyedJaggedTensor(**inputs))
        expected = theirs(torchrec.KeyedJaggedTensor(**inputs))
        assert sorted(got) == sorted(expected)
        for key in expected:
            assert got[key].lengths().tolist() == expected[key].lengths().tolist(), key
            assert torch.equal(got[key].values(), expected[key].values()), key
            if need_indices:
                assert torch.equal(got[key].weights(), expected[key].weights()), key
        assert got["user"].lengths().numel() == 1 and got["item"].lengths().numel() == 6  # not expanded


def test_gradients_reach_the_rows_of_each_feature_once():
    ours = rtk.EmbeddingCollection(_tables(rtk))
    inputs = _inputs(5)
    out = ours(rtk.KeyedJaggedTensor(**inputs))
    sum(jt.values().sum() for jt in out.values()).backward()
    expected = torch.zeros(10, 4)  # t_user: one row gradient of ones per id of "user"
    user_ids = rtk.KeyedJaggedTensor(**inputs)["user"].values()
    expected.index_add_(0, user_ids, torch.ones(user_ids.numel(), 4))
    assert torch.equal(ours.embeddings["t_user"].weight.grad, expected)


def test_the_sharded_collection_refuses_a_batch_size_per_feature():
    ec = rtk.EmbeddingCollection(_tables(rtk))
    plan = {t.name: rtk.ParameterSharding("table_wise", ranks=[0], shards=[
        rtk.ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in _tables(rtk)}
    sharded = shard_embedding_collection(ec, plan, ShardingEnv.local())
    with pytest.raises(ValueError, match="ShardedEmbeddingCollection does not take a variable batch size per feature"):
        sharded(rtk.KeyedJaggedTensor(**_inputs(0)))
