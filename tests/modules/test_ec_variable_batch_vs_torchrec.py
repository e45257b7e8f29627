"""A KJT with a batch size per feature (VBE) through the EmbeddingCollection: as TorchRec 1.8's unsharded one, each
feature's rows come back at the feature's own batch size (the inverse indices are not applied); as TorchRec's sharded
one, the sharded collection expands every feature to the full batch with the inverse indices (hand-worked here; on
2 ranks against TorchRec in tests/distributed/test_variable_batch_sharded.py). The sharded quantized one refuses."""

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


def _sharded_on_one_rank(need_indices):
    ec = rtk.EmbeddingCollection(_tables(rtk), need_indices=need_indices)
    plan = {"t_user": rtk.ParameterSharding("table_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 10, 4)]),
            "t_item": rtk.ParameterSharding("row_wise", ranks=[0, 0], shards=[
                rtk.ShardMetadata.on_rank(0, 0, 0, 12, 4), rtk.ShardMetadata.on_rank(0, 12, 0, 8, 4)])}
    return ec, shard_embedding_collection(ec, plan, ShardingEnv.local())


def test_the_sharded_collection_expands_each_feature_to_the_full_batch_by_hand():
    """As TorchRec 1.8's sharded EmbeddingCollection (compared on 2 ranks in
    tests/distributed/test_variable_batch_sharded.py): sample b of feature f is f's bag inverse[f][b]."""
    ec, sharded = _sharded_on_one_rank(need_indices=True)
    kjt = rtk.KeyedJaggedTensor(  # user: 1 sample [3, 5]; item: [7], []; seen: [], [19, 2]
        keys=["user", "item", "seen"], values=torch.tensor([3, 5, 7, 19, 2]), lengths=torch.tensor([2, 1, 0, 0, 2]),
        stride_per_key_per_rank=[[1], [2], [2]],
        inverse_indices=(["user", "item", "seen"], torch.tensor([[0, 0, 0], [1, 0, 1], [1, 1, 0]])))
    out = sharded(kjt).wait()
    expected = {"user": ([2, 2, 2], [3, 5, 3, 5, 3, 5]), "item": ([0, 1, 0], [7]), "seen": ([2, 2, 0], [19, 2, 19, 2])}
    tables = {"user": "t_user", "item": "t_item", "seen": "t_item"}
    for key, (lengths, ids) in expected.items():
        assert out[key].lengths().tolist() == lengths, key
        assert out[key].weights().tolist() == ids, key
        assert torch.equal(out[key].values(), ec.embeddings[tables[key]].weight[ids]), key
    sum(jt.values().sum() for jt in out.values()).backward()
    user_grad = next(w for table, _, w, _ in sharded.local_shards() if table == "t_user").grad
    # t_user is table-wise: rows 3 and 5 are read 3 times each, no other row
    assert torch.equal(user_grad[[3, 5]], torch.full((2, 4), 3.0))
    assert user_grad.abs().sum() == 2 * 4 * 3.0


def test_the_sharded_collection_needs_inverse_indices_for_different_batch_sizes():
    _, sharded = _sharded_on_one_rank(need_indices=False)
    kjt = rtk.KeyedJaggedTensor(keys=["user", "item", "seen"], values=torch.tensor([3, 7]),
                                lengths=torch.tensor([1, 1, 0, 0, 0]), stride_per_key_per_rank=[[1], [2], [2]])
    with pytest.raises(ValueError, match="no inverse_indices"):
        sharded(kjt)


def test_the_sharded_quantized_collection_refuses_a_batch_size_per_feature():
    from rectoolkit.quant import QuantEmbeddingCollection
    from rectoolkit.quant.sharding import shard_quant_embedding_collection

    qec = QuantEmbeddingCollection.from_float(rtk.EmbeddingCollection(_tables(rtk)), dtype=torch.int8, backend="torch")
    plan = {t.name: rtk.ParameterSharding("table_wise", ranks=[0], shards=[
        rtk.ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in _tables(rtk)}
    sharded = shard_quant_embedding_collection(qec, plan, ShardingEnv.local())
    with pytest.raises(ValueError, match="ShardedQuantEmbeddingCollection does not take a variable batch size"):
        sharded(rtk.KeyedJaggedTensor(**_inputs(0)))
