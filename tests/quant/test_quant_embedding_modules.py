"""QuantEmbeddingBagCollection / QuantEmbeddingCollection: layout, outputs vs a reference loop, both backends."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.ao import quantization as quant

import rectoolkit as rtk
from rectoolkit.modules.configs import DataType
from rectoolkit.quant import (
    QuantConfig,
    QuantEmbeddingBagCollection,
    QuantEmbeddingCollection,
    dequantize_rowwise,
    quantize_embeddings,
)

needs_fbgemm = [pytest.mark.fbgemm, pytest.mark.skipif(not rtk.fbgemm_available(), reason="fbgemm_gpu not available")]
BACKENDS = ["torch", pytest.param("fbgemm", marks=needs_fbgemm)]
DTYPES = [torch.int8, torch.quint4x2, torch.quint2x4, torch.float16, torch.float32]
DATA_TYPE = {torch.int8: DataType.INT8, torch.quint4x2: DataType.INT4, torch.quint2x4: DataType.INT2,
             torch.float16: DataType.FP16, torch.float32: DataType.FP32}


def _tables(pooling="SUM"):
    return [
        rtk.EmbeddingBagConfig(name="t_user", num_embeddings=30, embedding_dim=16, feature_names=["user"]),
        rtk.EmbeddingBagConfig(name="t_item", num_embeddings=50, embedding_dim=8, feature_names=["item", "seen"],
                               pooling=rtk.PoolingType(pooling)),
    ]


ROWS = {"user": 30, "item": 50, "seen": 50}


def _kjt(seed=0, keys=("seen", "user", "item"), batch=4, weighted=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    lengths[0] = 0
    values = torch.cat([torch.randint(0, ROWS[k], (int(lengths[i * batch:(i + 1) * batch].sum()),), generator=g)
                        for i, k in enumerate(keys)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return rtk.KeyedJaggedTensor.from_lengths_sync(keys=list(keys), values=values, lengths=lengths, weights=weights)


def _reference_pooled(qebc, kjt, weighted=False):
    """Per bag: sum (or mean) of the dequantized rows, by a plain loop over features and samples."""
    tables = {t.name: t for t in qebc.embedding_bag_configs()}
    table_of = {f: t.name for t in tables.values() for f in t.feature_names}
    deq = {name: dequantize_rowwise(qebc.state_dict()[f"embedding_bags.{name}.weight"], t.data_type, t.embedding_dim,
                                    backend="torch") for name, t in tables.items()}
    per_key = kjt.to_dict()
    out = []
    for feature in [f for t in tables.values() for f in t.feature_names]:
        jt = per_key[feature]
        table = tables[table_of[feature]]
        columns = []
        for ids, w in zip(jt.to_dense(), jt.to_dense_weights() if weighted else [None] * len(jt.to_dense())):
            rows = deq[table.name][ids]
            if w is not None:
                rows = rows * w[:, None]
            pooled = rows.sum(0) if len(ids) else torch.zeros(table.embedding_dim)
            if table.pooling == rtk.PoolingType.MEAN and len(ids):
                pooled = pooled / len(ids)
            columns.append(pooled)
        out.append(torch.stack(columns))
    return torch.cat(out, dim=1)


def test_seed_001_flow_gives_4096_x_80_uint8_buffers():
    tables = [rtk.EmbeddingBagConfig(name=n, num_embeddings=4096, embedding_dim=64, feature_names=[f])
              for n, f in [("product_table", "product"), ("user_table", "user")]]
    ebc = rtk.EmbeddingBagCollection(tables)

    class InferenceModule(torch.nn.Module):
        def __init__(self, ebc):
            super().__init__()
            self.ebc_ = ebc

        def forward(self, kjt):
            return self.ebc_(kjt)

    qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                          weight=quant.PlaceholderObserver.with_args(dtype=torch.int8))
    qmodel = quant.quantize_dynamic(InferenceModule(ebc), qconfig_spec={rtk.EmbeddingBagCollection: qconfig},
                                    mapping={rtk.EmbeddingBagCollection: QuantEmbeddingBagCollection}, inplace=False)
    assert "QuantizedEmbeddingBagCollection" in str(qmodel)
    buffers = {k: (tuple(v.shape), v.dtype) for k, v in qmodel.state_dict().items()}
    assert buffers == {"ebc_.embedding_bags.product_table.weight": ((4096, 80), torch.uint8),
                       "ebc_.embedding_bags.user_table.weight": ((4096, 80), torch.uint8)}
    assert list(qmodel.parameters()) == []  # buffers, not trainable parameters
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["product", "user"], values=torch.tensor([1, 2, 3, 4]),
                                                  lengths=torch.tensor([1, 1, 2, 0]))
    out = qmodel(kjt)
    assert out.keys() == ["product", "user"] and out.values().shape == (2, 128)
    float_out = ebc(kjt).values()
    assert torch.allclose(out.values(), float_out, atol=2e-3)  # weights ~U(-1/64, 1/64): int8 step 1.2e-4


@pytest.mark.parametrize("dtype", DTYPES)
def test_from_float_and_quantize_dynamic_store_the_same_bytes(dtype):
    ebc = rtk.EmbeddingBagCollection(_tables())
    direct = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype)
    model = quantize_embeddings(torch.nn.Sequential(ebc), dtype=dtype)
    assert isinstance(model[0], QuantEmbeddingBagCollection)
    for key, value in direct.state_dict().items():
        assert torch.equal(model.state_dict()[f"0.{key}"], value)
    assert [t.data_type for t in direct.embedding_bag_configs()] == [DATA_TYPE[dtype]] * 2
    assert [t.data_type for t in ebc.embedding_bag_configs()] == [DataType.FP32] * 2  # float configs untouched


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", False), ("SUM", True)])
def test_pooled_output_equals_reference_loop(backend, dtype, pooling, weighted):
    ebc = rtk.EmbeddingBagCollection(_tables(pooling), is_weighted=weighted)
    qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend=backend)
    assert qebc.backend == backend
    kjt = _kjt(seed=1, weighted=weighted)
    out = qebc(kjt)
    assert out.keys() == ["user", "item", "seen"]
    assert out.length_per_key() == [16, 8, 8]
    torch.testing.assert_close(out.values(), _reference_pooled(qebc, kjt, weighted), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_storage_types_per_table(backend):
    ebc = rtk.EmbeddingBagCollection(_tables("MEAN"))
    qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                          weight=quant.PlaceholderObserver.with_args(dtype=torch.int8),
                          per_table_weight_dtype={"t_item": torch.quint4x2})
    model = quant.quantize_dynamic(torch.nn.Sequential(ebc), qconfig_spec={rtk.EmbeddingBagCollection: qconfig},
                                   mapping={rtk.EmbeddingBagCollection: QuantEmbeddingBagCollection}, inplace=False)
    qebc = model[0]
    assert [t.data_type for t in qebc.embedding_bag_configs()] == [DataType.INT8, DataType.INT4]
    assert qebc.state_dict()["embedding_bags.t_item.weight"].shape == (50, 16)  # 4 + 8 * 4 / 8 -> 16
    fresh = QuantEmbeddingBagCollection(qebc.embedding_bag_configs(), backend=backend)
    fresh.load_state_dict(qebc.state_dict())
    kjt = _kjt(seed=2)
    torch.testing.assert_close(fresh(kjt).values(), _reference_pooled(qebc, kjt), rtol=1e-5, atol=1e-6)


@pytest.mark.fbgemm
@pytest.mark.skipif(not rtk.fbgemm_available(), reason="fbgemm_gpu not available")
@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_and_fbgemm_lookups_agree(dtype):
    ebc = rtk.EmbeddingBagCollection(_tables("MEAN"), is_weighted=True)
    kjt = _kjt(seed=5, weighted=True, batch=16)
    by_torch = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend="torch")(kjt).values()
    by_fbgemm = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend="fbgemm")(kjt).values()
    torch.testing.assert_close(by_torch, by_fbgemm, rtol=1e-6, atol=1e-6)


def test_disable_fbgemm_env_selects_torch(monkeypatch):
    monkeypatch.setenv("RECTOOLKIT_DISABLE_FBGEMM", "1")
    qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(_tables()), dtype=torch.int8)
    assert qebc.backend == "torch"
    with pytest.raises(RuntimeError, match="not available"):
        QuantEmbeddingBagCollection(_tables(), backend="fbgemm")


def test_state_dict_round_trip_deepcopy_and_to_keep_one_storage():
    ebc = rtk.EmbeddingBagCollection(_tables())
    qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, backend="torch")
    kjt = _kjt(seed=3)
    expected = qebc(kjt).values()
    fresh = QuantEmbeddingBagCollection(copy.deepcopy(qebc.embedding_bag_configs()), backend="torch")
    fresh.load_state_dict(qebc.state_dict())
    assert torch.equal(fresh(kjt).values(), expected)
    assigned = QuantEmbeddingBagCollection(copy.deepcopy(qebc.embedding_bag_configs()), backend="torch")
    assigned.load_state_dict({k: v.clone() for k, v in qebc.state_dict().items()}, assign=True)
    assert torch.equal(assigned(kjt).values(), expected)
    for module in (copy.deepcopy(qebc), qebc.to("cpu")):
        assert torch.equal(module(kjt).values(), expected)
        storage = module._lookup.weights.untyped_storage().data_ptr()
        assert all(b.untyped_storage().data_ptr() == storage for b in module.state_dict().values())
    assert qebc.storage_bytes() == 30 * 32 + 50 * 16  # int8: 4 + 16 -> 32 bytes, 4 + 8 -> 16 bytes


def test_quantized_memory_per_dtype_and_row_alignment():
    tables = [rtk.EmbeddingBagConfig(name="t", num_embeddings=1000, embedding_dim=64)]
    ebc = rtk.EmbeddingBagCollection(tables)
    fp32_bytes = 1000 * 64 * 4
    sizes = {d: QuantEmbeddingBagCollection.from_float(ebc, dtype=d).storage_bytes() for d in DTYPES}
    # TorchRec's layout (rows padded to 16 bytes): int8 is 80 / 256 = 31.25% of fp32 at dim 64
    assert sizes == {torch.int8: 80_000, torch.quint4x2: 48_000, torch.quint2x4: 32_000,
                     torch.float16: 128_000, torch.float32: fp32_bytes}
    # fbgemm's CPU default (no padding beyond 4 bytes): 68 / 256 = 26.6%
    packed = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, row_alignment=4)
    assert packed.storage_bytes() == 68_000 <= 0.3 * fp32_bytes
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["t"], values=torch.tensor([1, 5, 999]), lengths=torch.tensor([2, 1]))
    default = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8)
    assert torch.equal(packed(kjt).values(), default(kjt).values())


@pytest.mark.fbgemm
@pytest.mark.skipif(not rtk.fbgemm_available(), reason="fbgemm_gpu not available")
@pytest.mark.parametrize("row_alignment", [1, 4, 8])
def test_backends_agree_for_any_row_alignment(row_alignment):
    tables = [rtk.EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=64),
              rtk.EmbeddingBagConfig(name="u", num_embeddings=77, embedding_dim=12, feature_names=["u"])]
    ebc = rtk.EmbeddingBagCollection(tables)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["t", "u"], values=torch.randint(0, 77, (120,)),
                                                  lengths=torch.full((8,), 15))
    for dtype in DTYPES:
        outs = [QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend=b, row_alignment=row_alignment)(kjt)
                for b in ("torch", "fbgemm")]
        torch.testing.assert_close(outs[0].values(), outs[1].values(), rtol=1e-6, atol=1e-6)


def test_features_in_any_key_order_and_errors():
    qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(_tables()), dtype=torch.int8)
    kjt = _kjt(seed=4, keys=("seen", "user", "item"))
    in_order = kjt.permute(["user", "item", "seen"])
    assert torch.equal(qebc(kjt).values(), qebc(in_order).values())
    with pytest.raises(ValueError, match=r"no feature\(s\) \['seen'\]"):
        qebc(rtk.KeyedJaggedTensor.from_lengths_sync(keys=["user", "item"], values=torch.tensor([1, 2]),
                                                     lengths=torch.tensor([1, 1])))
    bad = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["user", "item", "seen"], values=torch.tensor([1, 2, 50]),
                                                  lengths=torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match=r"id 50 of feature 'seen' .* table 't_item' with num_embeddings=50"):
        qebc(bad)
    # an empty feature before the bad one: the error still names the right feature and sample
    negative = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["user", "item", "seen"], values=torch.tensor([3, 4, -1]),
                                                       lengths=torch.tensor([0, 0, 1, 1, 0, 1]))
    with pytest.raises(ValueError, match=r"id -1 of feature 'seen' \(sample 1\)"):
        qebc(negative)
    with pytest.raises(ValueError, match="pass dtype"):
        QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(_tables()))
    with pytest.raises(ValueError, match="multiple of 4"):
        QuantEmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=6,
                                                            data_type=DataType.INT2)])
    with pytest.raises(ValueError, match="names tables \\['nope'\\]"):
        QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(_tables()), dtype=torch.int8,
                                               per_table_weight_dtype={"nope": torch.float16})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.float16])
def test_embedding_collection_rows_equal_dequantized_table(backend, dtype):
    tables = [rtk.EmbeddingConfig(name="t_a", num_embeddings=30, embedding_dim=8, feature_names=["user"]),
              rtk.EmbeddingConfig(name="t_b", num_embeddings=50, embedding_dim=8, feature_names=["item", "seen"])]
    ec = rtk.EmbeddingCollection(tables, need_indices=True)
    qec = QuantEmbeddingCollection.from_float(ec, dtype=dtype, backend=backend)
    assert qec.state_dict()["embeddings.t_a.weight"].dtype == torch.uint8
    kjt = _kjt(seed=6)
    out = qec(kjt)
    assert list(out) == ["user", "item", "seen"]
    deq = {t.name: dequantize_rowwise(qec.state_dict()[f"embeddings.{t.name}.weight"], DATA_TYPE[dtype], 8)
           for t in tables}
    table_of = {"user": "t_a", "item": "t_b", "seen": "t_b"}
    for feature, jt in out.items():
        ids = kjt[feature].values()
        torch.testing.assert_close(jt.values(), deq[table_of[feature]][ids], rtol=1e-6, atol=1e-7)
        assert torch.equal(jt.lengths(), kjt[feature].lengths())
        assert torch.equal(jt.weights(), ids)  # need_indices


def test_mixed_storage_types_in_embedding_collection_torch_path():
    tables = [rtk.EmbeddingConfig(name="t_a", num_embeddings=30, embedding_dim=8, feature_names=["user"]),
              rtk.EmbeddingConfig(name="t_b", num_embeddings=50, embedding_dim=8, feature_names=["item", "seen"])]
    qec = QuantEmbeddingCollection.from_float(rtk.EmbeddingCollection(tables), dtype=torch.int8,
                                              per_table_weight_dtype={"t_b": torch.float16}, backend="torch")
    kjt = _kjt(seed=7)
    out = qec(kjt)
    for feature, name, data_type in [("user", "t_a", DataType.INT8), ("seen", "t_b", DataType.FP16)]:
        deq = dequantize_rowwise(qec.state_dict()[f"embeddings.{name}.weight"], data_type, 8)
        torch.testing.assert_close(out[feature].values(), deq[kjt[feature].values()])


def test_unaligned_groups_with_row_alignment_one():
    # an INT2 table of dim 12 has 3 + 4 = 7-byte rows: the FP32 table after it starts at an odd byte
    tables = [rtk.EmbeddingBagConfig(name="t_user", num_embeddings=30, embedding_dim=12, feature_names=["user"]),
              rtk.EmbeddingBagConfig(name="t_item", num_embeddings=50, embedding_dim=8, feature_names=["item", "seen"])]
    qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(tables), dtype=torch.quint2x4,
                                                  per_table_weight_dtype={"t_item": torch.float32},
                                                  row_alignment=1, backend="torch")
    assert qebc.state_dict()["embedding_bags.t_user.weight"].shape == (30, 7)
    kjt = _kjt(seed=8)
    torch.testing.assert_close(qebc(kjt).values(), _reference_pooled(qebc, kjt), rtol=1e-5, atol=1e-6)


def test_mixed_types_refused_where_a_table_cannot_be_stored_naming_the_table():
    tables = [rtk.EmbeddingBagConfig(name="t_a", num_embeddings=10, embedding_dim=8, feature_names=["a"]),
              rtk.EmbeddingBagConfig(name="t_b", num_embeddings=10, embedding_dim=6, feature_names=["b"])]
    ebc = rtk.EmbeddingBagCollection(tables)
    with pytest.raises(ValueError, match=r"table 't_b': cannot store embedding weights as torch.bfloat16"):
        QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, per_table_weight_dtype={"t_b": torch.bfloat16})
    with pytest.raises(ValueError, match=r"table 't_b': INT2 packs 4 columns per byte, .* multiple of 4; got 6"):
        QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, per_table_weight_dtype={"t_b": torch.quint2x4})
    configs = copy.deepcopy(tables)
    configs[0].data_type = DataType.BF16
    with pytest.raises(ValueError, match=r"table 't_a': cannot store embedding weights as BF16; use one of"):
        QuantEmbeddingBagCollection(configs)
