"""Differential tests: our quantized collections store TorchRec's bytes and give TorchRec's outputs."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.ao import quantization as quant

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

from torchrec.modules.embedding_configs import QuantConfig as TorchRecQuantConfig  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchRecQEBC  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingCollection as TorchRecQEC  # noqa: E402

BACKENDS = ["torch", pytest.param("fbgemm", marks=[pytest.mark.fbgemm, pytest.mark.skipif(
    not rtk.fbgemm_available(), reason="fbgemm_gpu not available")])]
DTYPES = [torch.int8, torch.quint4x2, torch.quint2x4, torch.float16, torch.float32]


def _bag_tables(lib):
    return [lib.EmbeddingBagConfig(name="t1", num_embeddings=50, embedding_dim=64, feature_names=["f1", "f3"]),
            lib.EmbeddingBagConfig(name="t2", num_embeddings=30, embedding_dim=16, feature_names=["f2"],
                                   pooling=lib.PoolingType.MEAN)]


def _inputs(seed, batch=5, weighted=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (3 * batch,), generator=g)
    rows = [50] * batch + [30] * batch + [50] * batch
    values = torch.cat([torch.randint(0, n, (int(length),), generator=g) for n, length in zip(rows, lengths)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return dict(keys=["f1", "f2", "f3"], values=values, lengths=lengths, weights=weights)


def _torchrec_quantize(module, module_type, quant_type, dtype):
    qconfig = TorchRecQuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                                  weight=quant.PlaceholderObserver.with_args(dtype=dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quant.quantize_dynamic(torch.nn.Sequential(module), qconfig_spec={module_type: qconfig},
                                      mapping={module_type: quant_type}, inplace=False)[0]


def _raw(tensor):
    return getattr(tensor, "elem", tensor)  # TorchRec wraps INT4/INT2 rows in UInt4Tensor/UInt2Tensor


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
def test_quant_ebc_bytes_and_outputs_equal_torchrec(backend, dtype, weighted):
    ebc = rtk.EmbeddingBagCollection(_bag_tables(rtk), is_weighted=weighted)
    theirs_float = torchrec.EmbeddingBagCollection(tables=_bag_tables(torchrec), is_weighted=weighted)
    theirs_float.load_state_dict(ebc.state_dict())
    ours = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend=backend)
    theirs = _torchrec_quantize(theirs_float, torchrec.EmbeddingBagCollection, TorchRecQEBC, dtype)
    their_state = theirs.state_dict()
    assert list(ours.state_dict()) == list(their_state)
    for key, value in ours.state_dict().items():
        assert torch.equal(value, _raw(their_state[key])), key
    inputs = _inputs(seed=11, weighted=weighted)
    out = ours(rtk.KeyedJaggedTensor.from_lengths_sync(**inputs))
    expected = theirs(torchrec.KeyedJaggedTensor.from_lengths_sync(**inputs))
    assert out.keys() == expected.keys() and out.length_per_key() == expected.length_per_key()
    torch.testing.assert_close(out.values(), expected.values(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2])
def test_torchrec_state_dict_loads_into_ours(dtype):
    theirs = _torchrec_quantize(torchrec.EmbeddingBagCollection(tables=_bag_tables(torchrec)),
                                torchrec.EmbeddingBagCollection, TorchRecQEBC, dtype)
    tables = _bag_tables(rtk)
    for t in tables:
        t.data_type = rtk.DataType.INT8 if dtype == torch.int8 else rtk.DataType.INT4
    ours = QuantEmbeddingBagCollection(tables)
    ours.load_state_dict({k: _raw(v) for k, v in theirs.state_dict().items()})
    inputs = _inputs(seed=12)
    torch.testing.assert_close(ours(rtk.KeyedJaggedTensor.from_lengths_sync(**inputs)).values(),
                               theirs(torchrec.KeyedJaggedTensor.from_lengths_sync(**inputs)).values())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.float16])
def test_quant_ec_equals_torchrec(backend, dtype):
    def tables(lib):
        return [lib.EmbeddingConfig(name="t1", num_embeddings=50, embedding_dim=16, feature_names=["f1", "f3"]),
                lib.EmbeddingConfig(name="t2", num_embeddings=30, embedding_dim=16, feature_names=["f2"])]

    ec = rtk.EmbeddingCollection(tables(rtk))
    theirs_float = torchrec.EmbeddingCollection(tables=tables(torchrec))
    theirs_float.load_state_dict(ec.state_dict())
    ours = QuantEmbeddingCollection.from_float(ec, dtype=dtype, backend=backend)
    theirs = _torchrec_quantize(theirs_float, torchrec.EmbeddingCollection, TorchRecQEC, dtype)
    for key, value in ours.state_dict().items():
        assert torch.equal(value, _raw(theirs.state_dict()[key])), key
    inputs = _inputs(seed=13)
    out = ours(rtk.KeyedJaggedTensor.from_lengths_sync(**inputs))
    expected = theirs(torchrec.KeyedJaggedTensor.from_lengths_sync(**inputs))
    assert sorted(out) == sorted(expected)
    for key in out:
        torch.testing.assert_close(out[key].values(), expected[key].values())
        assert torch.equal(out[key].lengths(), expected[key].lengths())
