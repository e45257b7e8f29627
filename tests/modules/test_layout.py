"""The collections' one front door (rectoolkit.modules.layout): every family accepts and refuses the same inputs.

Each case runs on the float, quantized and sharded collections (sharded: world size 1, several sharding types),
so a new family or sharding type that skips the front door fails here.
"""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection, shard_embedding_collection
from rectoolkit.modules import layout
from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from rectoolkit.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection

ROWS, DIM = 6, 4


def _bag_tables(weighted_dims=(DIM, 2 * DIM)):
    return [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=d, feature_names=[f"f{i}"])
            for i, d in enumerate(weighted_dims)]


def _seq_tables():
    return [rtk.EmbeddingConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{i}"])
            for i in range(2)]


def _plan(kind: str, tables):
    if kind == "row_wise":  # two row blocks on the one rank: ids are bucketed
        return {t.name: ParameterSharding("row_wise", ranks=[0, 0], shards=[
            ShardMetadata.on_rank(0, 0, 0, 3, t.embedding_dim), ShardMetadata.on_rank(0, 3, 0, ROWS - 3, t.embedding_dim)])
            for t in tables}
    return {t.name: ParameterSharding(kind, ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, ROWS, t.embedding_dim)])
            for t in tables}


def _collections(weighted=False, optimizer=None):
    """(name, collection, tables reader) of every bag family: float, quantized, sharded per type."""
    kwargs = dict(optimizer=optimizer, lr=0.5) if optimizer else {}
    ebc = rtk.EmbeddingBagCollection(_bag_tables(), is_weighted=weighted, **kwargs)
    out = [("float", ebc)]
    if optimizer is None:
        out.append(("quant", QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8)))
    for kind in ("table_wise", "row_wise", "column_wise", "data_parallel"):
        source = rtk.EmbeddingBagCollection(_bag_tables(), is_weighted=weighted, **kwargs)
        out.append((f"sharded {kind}",
                    shard_embedding_bag_collection(source, _plan(kind, _bag_tables()), ShardingEnv.local())))
    return out


def _sequence_collections():
    ec = rtk.EmbeddingCollection(_seq_tables())
    return [("float", ec), ("quant", QuantEmbeddingCollection.from_float(ec, dtype=torch.int8)),
            ("sharded row_wise", shard_embedding_collection(ec, _plan("row_wise", _seq_tables()), ShardingEnv.local()))]


def _kjt(values, lengths, weights=None):
    return rtk.KeyedJaggedTensor(keys=["f0", "f1"], values=values, lengths=torch.tensor(lengths), weights=weights)


def _snapshot(collection):
    return [p.detach().clone() for p in collection.parameters()] + [b.clone() for b in collection.buffers()]


# ------------------------------------------------------------------------------------------------ float ids
@pytest.mark.parametrize("pick", range(6))
def test_float_ids_are_refused_by_every_bag_collection(pick):
    name, collection = _collections()[pick]
    kjt = _kjt(torch.tensor([1.0, 2.7, float("nan")]), [1, 1, 1, 0])  # a pandas column with a missing value
    with pytest.raises(ValueError, match=r"ids of the KeyedJaggedTensor are torch.float32; ids must be integers"):
        collection(kjt)


@pytest.mark.parametrize("pick", range(3))
def test_float_ids_are_refused_by_every_sequence_collection(pick):
    name, collection = _sequence_collections()[pick]
    with pytest.raises(ValueError, match=r"ids must be integers"):
        collection(_kjt(torch.tensor([1.0, 2.0]), [1, 0, 1, 0]))


# ------------------------------------------------------------------------------------------------ weights
@pytest.mark.parametrize("pick", range(6))
def test_weights_given_to_an_unweighted_collection_are_refused(pick):
    name, collection = _collections()[pick]
    kjt = _kjt(torch.tensor([1, 2, 3]), [1, 1, 1, 0], weights=torch.tensor([0.5, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"is not weighted but the KeyedJaggedTensor has per-id weights"):
        collection(kjt)


@pytest.mark.parametrize("pick", range(3))
def test_weights_given_to_a_sequence_collection_are_refused_without_advising_is_weighted(pick):
    name, collection = _sequence_collections()[pick]  # EmbeddingCollection has no is_weighted argument
    kjt = _kjt(torch.tensor([1, 2, 3]), [1, 1, 1, 0], weights=torch.tensor([0.5, 2.0, 1.0]))
    with pytest.raises(ValueError, match=r"per-id weights, which it would ignore; a sequence collection pools "
                                         r"nothing, so no weights apply: drop them") as refused:
        collection(kjt)
    assert "is_weighted=True" not in str(refused.value)


@pytest.mark.parametrize("pick", range(6))
def test_nan_and_inf_weights_are_refused_before_the_tables(pick):
    name, collection = _collections(weighted=True)[pick]
    before = _snapshot(collection)
    for bad in (float("nan"), float("inf")):
        kjt = _kjt(torch.tensor([1, 2, 3]), [1, 1, 1, 0], weights=torch.tensor([0.5, 1.0, bad]))
        with pytest.raises(ValueError, match=r"per-id weight (nan|inf) of feature 'f1' \(value 2 of the batch\) is not finite"):
            collection(kjt)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(collection)))


def test_finite_checks_can_be_switched_off(monkeypatch):
    ebc = rtk.EmbeddingBagCollection(_bag_tables(), is_weighted=True)
    kjt = _kjt(torch.tensor([1, 2, 3]), [1, 1, 1, 0], weights=torch.tensor([0.5, 1.0, float("nan")]))
    monkeypatch.setenv(layout.FINITE_CHECKS_ENV, "0")
    out = ebc(kjt).values()  # no check: the NaN weight (feature f1, sample 0) reaches its pooled value
    assert torch.isnan(out[0, DIM:]).all() and not torch.isnan(out[:, :DIM]).any() and not torch.isnan(out[1]).any()
    monkeypatch.setenv(layout.FINITE_CHECKS_ENV, "1")
    layout.set_finite_checks(False)
    try:
        ebc(kjt)  # the function wins over the variable
    finally:
        layout.set_finite_checks(None)
    with pytest.raises(ValueError, match="is not finite"):
        ebc(kjt)


# ------------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("pick", range(5))
def test_non_finite_gradients_are_refused_before_the_fused_update(pick):
    name, collection = _collections(optimizer="sgd")[pick]
    before = _snapshot(collection)
    out = collection(_kjt(torch.tensor([1, 2, 4]), [1, 1, 0, 1])).values()
    with pytest.raises(ValueError, match=r"gradient reaching the embeddings has \d+ NaN/inf values"):
        (out * torch.tensor(float("nan"))).sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(collection))), f"{name}: a table changed"
    # a finite step still trains: the check does not block it (DATA_PARALLEL replicas have the dense kernel, as
    # TorchRec's: their gradient goes to .grad for the dense optimizer instead of a fused update)
    collection(_kjt(torch.tensor([1, 2, 4]), [1, 1, 0, 1])).values().sum().backward()
    if name == "sharded data_parallel":
        grads = [p.grad for p in collection.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.any() for g in grads), name
    else:
        assert any(not torch.equal(a, b) for a, b in zip(before, _snapshot(collection))), f"{name}: sgd did not update"


def test_without_the_check_a_nan_gradient_corrupts_the_table(monkeypatch):
    """What the check prevents (and proof that switching it off does switch it off)."""
    monkeypatch.setenv(layout.FINITE_CHECKS_ENV, "off")
    ebc = rtk.EmbeddingBagCollection(_bag_tables(), optimizer="sgd", lr=0.5)
    (ebc(_kjt(torch.tensor([1, 2]), [1, 0, 1, 0])).values() * float("nan")).sum().backward()
    assert torch.isnan(ebc.embedding_bags["t0"].weight[1]).all()


# ------------------------------------------------------------------------------------------------ empty batch
@pytest.mark.parametrize("optimizer", [None, "sgd", "row_wise_adagrad"])
@pytest.mark.parametrize("pooling", [rtk.PoolingType.SUM, rtk.PoolingType.MEAN])
def test_empty_batch_forward_and_backward(optimizer, pooling):
    tables = _bag_tables()
    for t in tables:
        t.pooling = pooling
    kwargs = dict(optimizer=optimizer, lr=0.5) if optimizer else {}
    ebc = rtk.EmbeddingBagCollection(tables, **kwargs)
    before = _snapshot(ebc)
    out = ebc(_kjt(torch.empty(0, dtype=torch.int64), []))
    assert tuple(out.values().shape) == (0, DIM + 2 * DIM) and out.keys() == ["f0", "f1"]
    out.values().sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(ebc)))
    if optimizer is None:
        assert all(p.grad is not None and not p.grad.any() for p in ebc.parameters())


@pytest.mark.parametrize("kind", ["table_wise", "row_wise", "data_parallel"])
def test_empty_batch_on_the_sharded_path(kind):
    sharded = shard_embedding_bag_collection(rtk.EmbeddingBagCollection(_bag_tables(), optimizer="sgd", lr=0.5),
                                             _plan(kind, _bag_tables()), ShardingEnv.local())
    out = sharded(_kjt(torch.empty(0, dtype=torch.int64), []))
    assert tuple(out.values().shape) == (0, 3 * DIM)
    out.values().sum().backward()


# ------------------------------------------------------------------------------------------------ id range
@pytest.mark.parametrize("pick", range(6))
def test_out_of_range_ids_get_one_error_everywhere(pick):
    name, collection = _collections()[pick]
    with pytest.raises(ValueError, match=r"id 6 of feature 'f1' \(sample 1\) is out of range for table 't1' with "
                                         r"num_embeddings=6 \(valid ids are 0..5; 1 bad ids in this batch\)"):
        collection(_kjt(torch.tensor([1, 2, 6]), [1, 0, 1, 1]))


@pytest.mark.parametrize("values, expected", [
    ([1.0, -2.0, 3.0], True),
    ([3e38, 3e38, 3e38], True),  # finite entries whose sum overflows: the entry-wise check decides
    ([-3e38, -3e38], True),
    ([1.0, float("nan")], False),
    ([float("inf"), 1.0], False),
    ([float("inf"), float("-inf")], False),  # the sum is NaN
    ([], True),
])
def test_all_finite_is_exact(values, expected):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        tensor = torch.tensor(values, dtype=torch.float32).to(dtype)
        assert layout.all_finite(tensor) is expected == bool(torch.isfinite(tensor).all()), dtype
    assert layout.all_finite(torch.tensor([1, 2, 3])) is True  # integers are always finite
