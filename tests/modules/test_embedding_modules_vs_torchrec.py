"""Differential tests: our collections and TorchRec's give the same outputs for the same weights."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk

from test_ebc_variable_batch_vs_torchrec import vbe_inputs

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

BACKENDS = ["torch", pytest.param("fbgemm", marks=[pytest.mark.fbgemm, pytest.mark.skipif(
    not rtk.fbgemm_available(), reason="fbgemm_gpu not available")])]


def _tables(lib, pooling):
    cfg = lib.EmbeddingBagConfig
    return [cfg(name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"], pooling=lib.PoolingType(pooling)),
            cfg(name="t_item", num_embeddings=20, embedding_dim=8, feature_names=["item", "seen"], pooling=lib.PoolingType(pooling))]


def _inputs(seed, weighted):
    g = torch.Generator().manual_seed(seed)
    keys = ["seen", "user", "item"]
    stride = 4
    lengths = torch.randint(0, 4, (len(keys) * stride,), generator=g)
    lengths[0] = 0  # an empty bag for sure
    rows = {"user": 10, "item": 20, "seen": 20}
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[i * stride:(i + 1) * stride].sum()),), generator=g)
                        for i, k in enumerate(keys)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return dict(keys=keys, values=values, lengths=lengths, weights=weights)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", False), ("SUM", True)])
def test_ebc_same_outputs_as_torchrec_both_ways(backend, pooling, weighted):
    ours = rtk.EmbeddingBagCollection(_tables(rtk, pooling), is_weighted=weighted, optimizer="sgd", lr=0.0, backend=backend)
    theirs = torchrec.EmbeddingBagCollection(tables=_tables(torchrec, pooling), is_weighted=weighted)
    theirs.load_state_dict(ours.state_dict())
    inputs = _inputs(0, weighted)
    a = ours(rtk.KeyedJaggedTensor(**inputs))
    b = theirs(torchrec.KeyedJaggedTensor(**inputs))
    assert a.keys() == b.keys() and a.length_per_key() == b.length_per_key()
    torch.testing.assert_close(a.values(), b.values(), rtol=1e-5, atol=1e-6)
    fresh = torchrec.EmbeddingBagCollection(tables=_tables(torchrec, pooling), is_weighted=weighted)
    ours.load_state_dict(fresh.state_dict())
    torch.testing.assert_close(ours(rtk.KeyedJaggedTensor(**inputs)).values(),
                               fresh(torchrec.KeyedJaggedTensor(**inputs)).values(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("torchrec_args", [(), (torch.device("cpu"), True, True, {"t_a": False})])
def test_ec_same_outputs_as_torchrec(torchrec_args):
    def tables(lib):
        return [lib.EmbeddingConfig(name="t_a", num_embeddings=20, embedding_dim=4, feature_names=["item", "seen"]),
                lib.EmbeddingConfig(name="t_b", num_embeddings=10, embedding_dim=4, feature_names=["user"])]
    # TorchRec's arguments in its order: device, need_indices, use_gather_select, use_gather_select_per_sharding
    ours = rtk.EmbeddingCollection(tables(rtk), *torchrec_args)
    theirs = torchrec.EmbeddingCollection(tables(torchrec), *torchrec_args)
    assert ours.need_indices() == theirs.need_indices()
    assert ours.use_gather_select() == theirs.use_gather_select()
    assert ours.use_gather_select_per_sharding() == theirs.use_gather_select_per_sharding()
    theirs.load_state_dict(ours.state_dict())
    inputs = _inputs(1, False)
    a = ours(rtk.KeyedJaggedTensor(**inputs))
    b = theirs(torchrec.KeyedJaggedTensor(**inputs))
    assert sorted(a) == sorted(b)
    for key in b:
        torch.testing.assert_close(a[key].values(), b[key].values())
        assert torch.equal(a[key].lengths(), b[key].lengths())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variable_batch", [False, True])
def test_fused_sgd_equals_torchrec_with_dense_sgd(backend, variable_batch):
    """Exact SGD fused into backward == TorchRec's unsharded EBC + torch.optim.SGD, after 3 steps (fp32, 1e-6).

    With a batch size per feature (VBE), every expanded row's gradient must reach its one pooled row."""
    ours = rtk.EmbeddingBagCollection(_tables(rtk, "SUM"), optimizer="sgd", lr=0.3, backend=backend)
    theirs = torchrec.EmbeddingBagCollection(tables=_tables(torchrec, "SUM"))
    theirs.load_state_dict(ours.state_dict())
    opt = torch.optim.SGD(theirs.parameters(), lr=0.3)
    make_inputs, batch = (vbe_inputs, 12) if variable_batch else (_inputs, 4)
    for step in range(3):
        inputs = make_inputs(10 + step, False)
        target = torch.randn(batch, 20, generator=torch.Generator().manual_seed(step))
        (ours(rtk.KeyedJaggedTensor(**inputs)).values() * target).sum().backward()
        (theirs(torchrec.KeyedJaggedTensor(**inputs)).values() * target).sum().backward()
        opt.step()
        opt.zero_grad()
    for name, value in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[name], value, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("config_name", ["EmbeddingBagConfig", "EmbeddingConfig"])
def test_configs_have_torchrecs_fields_in_torchrecs_order(config_name):
    """A config built from TorchRec's fields (dataclasses.asdict of TorchRec's, or positional arguments) builds
    here; the fields for TorchRec's virtual tables are refused away from their defaults, naming the field."""
    import dataclasses

    import torchrec

    theirs = getattr(torchrec, config_name)(num_embeddings=10, embedding_dim=4, name="t", feature_names=["f"])
    ours_type = getattr(rtk, config_name)
    assert [f.name for f in dataclasses.fields(ours_type)] == [f.name for f in dataclasses.fields(type(theirs))]
    fields = {k: v for k, v in dataclasses.asdict(theirs).items() if k not in ("init_fn", "data_type", "pooling")}
    assert ours_type(**fields).feature_names == ["f"]
    for name, value in [("use_virtual_table", True), ("total_num_buckets", 4), ("stash_weights", True),
                        ("enable_embedding_update", True), ("input_dim", 3)]:
        with pytest.raises(ValueError, match=f"table 't': {name}={value!r} is not supported.*leave it at"):
            ours_type(num_embeddings=10, embedding_dim=4, name="t", **{name: value})
