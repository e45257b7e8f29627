"""Padded batches (values longer than the sum of the lengths) as TorchRec 1.8 treats them, op by op on the same
KJT: accepted where TorchRec gives the right answer, with the same results; refused with a ValueError naming the
padding where TorchRec fails (to_dict, the collections' lookups) or would give wrong values (concat with padding
inside); values shorter than the lengths count are refused at construction."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

VALUES, LENGTHS = [1, 2, 3, 4, 0, 0], [2, 0, 1, 1]  # keys a, b; two padding values at the end


def _kjt(lib, weighted=False):
    return lib.KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor(VALUES), lengths=torch.tensor(LENGTHS),
                                 weights=torch.arange(6.0) if weighted else None)


def _jt_view(jt):
    return jt.values().tolist(), jt.lengths().tolist(), None if jt.weights_or_none() is None else jt.weights().tolist()


ACCEPTED = {
    "getitem": lambda lib: [_jt_view(_kjt(lib, True)[key]) for key in ("a", "b")],
    "length_per_key": lambda lib: (_kjt(lib).length_per_key(), _kjt(lib).offset_per_key()),
    "split": lambda lib: [(s.keys(), s.values().tolist(), s.lengths().tolist()) for s in _kjt(lib).split([1, 1])],
    "permute": lambda lib: (_kjt(lib).permute([1, 0]).values().tolist(), _kjt(lib).permute([1, 0]).lengths().tolist()),
    "from_lengths_sync": lambda lib: lib.KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.tensor(VALUES), lengths=torch.tensor(LENGTHS)).offsets().tolist(),
    "str": lambda lib: str(_kjt(lib)),
    "concat_last": lambda lib: lib.KeyedJaggedTensor.concat([
        lib.KeyedJaggedTensor(keys=["c"], values=torch.tensor([9]), lengths=torch.tensor([1, 0])), _kjt(lib)])["b"]
        .values().tolist(),
    "jt_dense": lambda lib: [t.tolist() for t in lib.JaggedTensor(
        values=torch.tensor([1.0, 2.0, 3.0, 0.0]), lengths=torch.tensor([2, 1])).to_dense()],
    "jt_padded_dense": lambda lib: lib.JaggedTensor(
        values=torch.tensor([1.0, 2.0, 3.0, 0.0]), lengths=torch.tensor([2, 1])).to_padded_dense().tolist(),
}


@pytest.mark.parametrize("op", sorted(ACCEPTED))
def test_what_torchrec_accepts_gives_the_same(op):
    assert ACCEPTED[op](rtk) == ACCEPTED[op](torchrec)


def _bag_collection(lib):
    ebc = lib.EmbeddingBagCollection(tables=[lib.EmbeddingBagConfig(name="t", embedding_dim=2, num_embeddings=10,
                                                                    feature_names=["a", "b"])])
    return ebc


def _sequence_collection(lib):
    return lib.EmbeddingCollection(tables=[lib.EmbeddingConfig(name="t", embedding_dim=2, num_embeddings=10,
                                                               feature_names=["a", "b"])])


@pytest.mark.parametrize("op", ["to_dict", "ebc", "ec", "concat_inside"])
def test_what_torchrec_cannot_do_is_refused_naming_the_padding(op):
    run = {"to_dict": lambda lib: _kjt(lib).to_dict(),
           "ebc": lambda lib: _bag_collection(lib)(_kjt(lib)),
           "ec": lambda lib: _sequence_collection(lib)(_kjt(lib)),
           "concat_inside": lambda lib: lib.KeyedJaggedTensor.concat([
               _kjt(lib), lib.KeyedJaggedTensor(keys=["c"], values=torch.tensor([9]), lengths=torch.tensor([1, 0]))]),
           }[op]
    with pytest.raises(ValueError, match=r"padded batch.*values\[:4\]"):
        run(rtk)
    if op == "concat_inside":  # TorchRec concatenates, and its key "c" then reads a padding value
        assert run(torchrec)["c"].values().tolist() == [0]
    else:
        with pytest.raises(RuntimeError):
            run(torchrec)


def test_fewer_values_than_counted_is_refused():
    with pytest.raises(ValueError, match=r"lengths sum to 4 but values has only 3 entries"):
        rtk.KeyedJaggedTensor(keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor(LENGTHS))
    with pytest.raises(ValueError, match=r"lengths sum to 3 but values has only 2 entries"):
        rtk.JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([2, 1]))


def test_sharded_collections_refuse_a_padded_batch_at_the_front_door():
    from rectoolkit.distributed.comm import ShardingEnv
    from rectoolkit.distributed.sharded_ebc import shard_embedding_bag_collection
    from rectoolkit.plan.types import ParameterSharding, ShardMetadata

    plan = {"t": ParameterSharding("row_wise", "fused", [0], [ShardMetadata([0, 0], [10, 2], "rank:0/cpu")])}
    sharded = shard_embedding_bag_collection(_bag_collection(rtk), plan, ShardingEnv.local(torch.device("cpu")))
    with pytest.raises(ValueError, match=r"ShardedEmbeddingBagCollection.forward: .*padded batch.*values\[:4\]"):
        sharded(_kjt(rtk))
