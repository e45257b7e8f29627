"""EmbeddingBagCollection / EmbeddingCollection against per-table nn.EmbeddingBag / nn.Embedding references."""

from __future__ import annotations

import copy

import pytest
import torch

import rectoolkit as rtk
from rectoolkit import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor, PoolingType
from rectoolkit.kernels import fbgemm_available

BACKENDS = [
    "torch",
    pytest.param("fbgemm", marks=[pytest.mark.fbgemm,
                                  pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu not available")]),
]


def bag_tables(pooling=PoolingType.SUM):
    return [
        EmbeddingBagConfig(name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"], pooling=pooling),
        EmbeddingBagConfig(name="t_item", num_embeddings=20, embedding_dim=8, feature_names=["item", "seen"], pooling=pooling),
        EmbeddingBagConfig(name="t_geo", num_embeddings=5, embedding_dim=4, feature_names=["geo"], pooling=PoolingType.SUM),
    ]


def make_kjt(keys, rows, stride, seed, weighted=False, max_len=3):
    """Random KJT; key order may differ from the tables'; empty bags likely."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_len + 1, (len(keys) * stride,), generator=g)
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[i * stride:(i + 1) * stride].sum()),), generator=g)
                        for i, k in enumerate(keys)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights), values, lengths, weights


ROWS = {"user": 10, "item": 20, "seen": 20, "geo": 5}


def reference_pooled(ebc, keys, values, lengths, weights, stride, tables):
    """Loop of torch.nn.EmbeddingBag, one per table, over the features in table order."""
    columns = []
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    for table in tables:
        bag = torch.nn.EmbeddingBag(table.num_embeddings, table.embedding_dim, mode=table.pooling.value.lower(),
                                    include_last_offset=True)
        with torch.no_grad():
            bag.weight.copy_(ebc.embedding_bags[table.name].weight)
        for feature in table.feature_names:
            i = keys.index(feature)
            lo, hi = int(offsets[i * stride]), int(offsets[(i + 1) * stride])
            psw = weights[lo:hi] if weights is not None else None
            if psw is not None and table.pooling == PoolingType.MEAN:  # nn.EmbeddingBag cannot: weighted sum / length
                out = torch.nn.functional.embedding_bag(values[lo:hi], bag.weight, offsets[i * stride:(i + 1) * stride + 1] - lo,
                                                        mode="sum", per_sample_weights=psw, include_last_offset=True)
                out = out / lengths[i * stride:(i + 1) * stride].clamp(min=1).unsqueeze(1)
            else:
                out = bag(values[lo:hi], offsets[i * stride:(i + 1) * stride + 1] - lo, per_sample_weights=psw)
            columns.append(out)
    return torch.cat(columns, dim=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pooling", [PoolingType.SUM, PoolingType.MEAN])
@pytest.mark.parametrize("weighted", [False, True])
def test_ebc_equals_loop_of_embedding_bags(backend, pooling, weighted):
    tables = bag_tables(pooling)
    ebc = EmbeddingBagCollection(tables, is_weighted=weighted, optimizer="sgd", lr=0.0, backend=backend)
    keys = ["geo", "seen", "user", "item"]  # not the table order
    kjt, values, lengths, weights = make_kjt(keys, ROWS, stride=5, seed=1, weighted=weighted)
    out = ebc(kjt)
    assert out.keys() == ["user", "item", "seen", "geo"]
    assert out.length_per_key() == [4, 8, 8, 4]
    expected = reference_pooled(ebc, keys, values, lengths, weights, 5, tables)
    torch.testing.assert_close(out.values(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ec_equals_embedding_per_id(backend):
    tables = [EmbeddingConfig(name="t_a", num_embeddings=7, embedding_dim=4, feature_names=["a", "b"]),
              EmbeddingConfig(name="t_c", num_embeddings=4, embedding_dim=4, feature_names=["c"])]
    ec = EmbeddingCollection(tables, optimizer="row_wise_adagrad", lr=0.1, backend=backend)
    kjt, values, lengths, _ = make_kjt(["c", "a", "b"], {"a": 7, "b": 7, "c": 4}, stride=3, seed=2)
    out = ec(kjt)
    assert sorted(out) == ["a", "b", "c"]
    d = kjt.to_dict()
    for feature, table in [("a", "t_a"), ("b", "t_a"), ("c", "t_c")]:
        ref = torch.nn.functional.embedding(d[feature].values(), ec.embeddings[table].weight.detach())
        torch.testing.assert_close(out[feature].values(), ref)
        assert torch.equal(out[feature].lengths(), d[feature].lengths())
    before = ec.embeddings["t_c"].weight.detach().clone()
    sum(jt.values().sum() for jt in out.values()).backward()
    touched = torch.unique(d["c"].values())
    assert not torch.equal(ec.embeddings["t_c"].weight[touched], before[touched])


def test_state_dict_keys_shapes_and_per_table_writes():
    ebc = EmbeddingBagCollection(bag_tables(), optimizer="adagrad", lr=0.1)
    state = ebc.state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "embedding_bags.t_user.weight": (10, 4), "embedding_bags.t_item.weight": (20, 8), "embedding_bags.t_geo.weight": (5, 4)}
    assert [n for n, _ in ebc.named_parameters()] == list(state)
    with torch.no_grad():
        ebc.embedding_bags["t_item"].weight[3] = 1.5
    kjt = KeyedJaggedTensor(keys=["user", "item", "seen", "geo"], values=torch.tensor([3]),
                            lengths=torch.tensor([0, 1, 0, 0]))
    assert torch.all(ebc(kjt).to_dict()["item"] == 1.5)
    loaded = EmbeddingBagCollection(bag_tables(), optimizer="sgd", lr=0.1)
    loaded.load_state_dict(ebc.state_dict())
    torch.testing.assert_close(loaded(kjt).values(), ebc(kjt).values())
    assigned = EmbeddingBagCollection(bag_tables())
    assigned.load_state_dict({k: v.clone() for k, v in ebc.state_dict().items()}, assign=True)
    torch.testing.assert_close(assigned(kjt).values(), ebc(kjt).values())


def test_print_matches_torchrec_tutorial():
    ebc = rtk.EmbeddingBagCollection(device="cpu", tables=[
        rtk.EmbeddingBagConfig(name="product_table", embedding_dim=64, num_embeddings=4096, feature_names=["product"],
                               pooling=rtk.PoolingType.SUM),
        rtk.EmbeddingBagConfig(name="user_table", embedding_dim=64, num_embeddings=4096, feature_names=["user"],
                               pooling=rtk.PoolingType.SUM)])
    assert str(ebc.embedding_bags) == (
        "ModuleDict(\n  (product_table): EmbeddingBag(4096, 64, mode='sum')\n"
        "  (user_table): EmbeddingBag(4096, 64, mode='sum')\n)")
    product = rtk.JaggedTensor(values=torch.tensor([1, 2, 1, 5]), lengths=torch.tensor([3, 1]))
    user = rtk.JaggedTensor(values=torch.tensor([2, 3, 4, 1]), lengths=torch.tensor([2, 2]))
    result = ebc(rtk.KeyedJaggedTensor.from_jt_dict({"product": product, "user": user}))
    assert result.keys() == ["product", "user"] and tuple(result.values().shape) == (2, 128)


def test_meta_device_builds_any_size_without_allocating():
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=10**9, embedding_dim=256, feature_names=[f"f{i}"]) for i in range(4)]
    ebc = EmbeddingBagCollection(tables, device="meta", optimizer="adam")  # 4 TB of weights on a real device
    assert all(p.is_meta for p in ebc.parameters())
    assert ebc.state_dict()["embedding_bags.t3.weight"].shape == (10**9, 256)


def test_meta_then_to_empty_materializes():
    ebc = EmbeddingBagCollection(bag_tables(), device="meta")
    ebc = ebc.to_empty(device="cpu")
    with torch.no_grad():  # to_empty leaves whatever was in memory; make that deterministic garbage
        for p in ebc.parameters():
            p.fill_(float("nan"))
    ebc.reset_parameters()
    assert not any(p.isnan().any() for p in ebc.parameters())
    kjt, values, lengths, weights = make_kjt(["user", "item", "seen", "geo"], ROWS, stride=2, seed=9)
    torch.testing.assert_close(ebc(kjt).values(), reference_pooled(ebc, kjt.keys(), values, lengths, None, 2, bag_tables()))


def test_errors_name_the_feature_table_and_id():
    ebc = EmbeddingBagCollection(bag_tables())
    kjt = KeyedJaggedTensor(keys=["user", "item", "seen", "geo"], values=torch.tensor([1, 25]),
                            lengths=torch.tensor([1, 0, 1, 0]))
    with pytest.raises(ValueError, match=r"id 25 of feature 'seen'.*table 't_item'.*num_embeddings=20"):
        ebc(kjt)
    missing = KeyedJaggedTensor(keys=["user", "item"], values=torch.tensor([1]), lengths=torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"no feature\(s\) \['seen', 'geo'\]"):
        ebc(missing)
    hashed = EmbeddingBagCollection(bag_tables(), ids_out_of_range="hash")
    out = hashed(kjt).to_dict()["seen"]
    torch.testing.assert_close(out[0], hashed.embedding_bags["t_item"].weight[5].detach())


@pytest.mark.parametrize("backend", BACKENDS)
def test_combined_optimizer_steps_dense_and_fused_and_lr_propagates(backend):
    ebc = EmbeddingBagCollection(bag_tables(), optimizer="sgd", lr=0.5, backend=backend)
    dense = torch.nn.Linear(24, 1)
    dense_opt = torch.optim.SGD(dense.parameters(), lr=0.1)
    opt = rtk.CombinedOptimizer([("dense", dense_opt), ("sparse", ebc.fused_optimizer)])
    assert "sparse.embedding_bags.t_user.weight" in opt.params
    kjt = KeyedJaggedTensor(keys=["user", "item", "seen", "geo"], values=torch.tensor([1, 2, 3, 4]),
                            lengths=torch.tensor([1, 1, 1, 1]))
    before_dense = dense.weight.detach().clone()
    before_user = ebc.embedding_bags["t_user"].weight[1].detach().clone()
    dense(ebc(kjt).values()).sum().backward()
    opt.step()
    opt.zero_grad()
    assert not torch.equal(dense.weight, before_dense) and dense.weight.grad is None
    # d loss / d row = dense.weight[:, :4] before its step; fused SGD: row -= 0.5 * grad
    torch.testing.assert_close(ebc.embedding_bags["t_user"].weight[1], before_user - 0.5 * before_dense[0, :4])
    for group in opt.param_groups:
        group["lr"] = 0.0
    frozen = ebc.embedding_bags["t_user"].weight.detach().clone()
    dense(ebc(kjt).values()).sum().backward()
    torch.testing.assert_close(ebc.embedding_bags["t_user"].weight, frozen)
    assert ebc.kernel.get_learning_rate() == 0.0


def test_dense_mode_has_ordinary_grads_and_in_backward_filter():
    ebc = EmbeddingBagCollection(bag_tables())
    kjt = KeyedJaggedTensor(keys=["user", "item", "seen", "geo"], values=torch.tensor([1, 1, 2]),
                            lengths=torch.tensor([2, 0, 1, 0]))
    ebc(kjt).values().sum().backward()
    grad = ebc.embedding_bags["t_user"].weight.grad
    assert grad[1].tolist() == [2.0] * 4 and grad.sum() == 8.0
    assert len(list(rtk.optim.in_backward_optimizer_filter(ebc.named_parameters()))) == 3
    ebc.fuse_optimizer("adagrad", lr=0.1)
    assert list(rtk.optim.in_backward_optimizer_filter(ebc.named_parameters())) == []


def test_apply_optimizer_in_backward_then_fuse():
    from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

    ebc = EmbeddingBagCollection(bag_tables())
    for _, param in ebc.named_parameters():
        apply_optimizer_in_backward(torch.optim.SGD, [param], {"lr": 0.5})
    fused = ebc.fuse_optimizer()
    assert "lr: 0.5" in repr(fused) and ebc.kernel.optimizer.optimizer.value == "sgd"


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepcopy_is_independent_and_equal(backend):
    ebc = EmbeddingBagCollection(bag_tables(), optimizer="row_wise_adagrad", lr=0.1, backend=backend)
    kjt, *_ = make_kjt(["user", "item", "seen", "geo"], ROWS, stride=3, seed=4)
    clone = copy.deepcopy(ebc)
    torch.testing.assert_close(clone(kjt).values(), ebc(kjt).values())
    clone(kjt).values().sum().backward()  # updates the clone only
    assert not torch.equal(clone.embedding_bags["t_item"].weight, ebc.embedding_bags["t_item"].weight)
    sd = clone.fused_optimizer.state_dict()["state"]
    assert sd["embedding_bags.t_item.weight"]["momentum1"].shape == (20,)
