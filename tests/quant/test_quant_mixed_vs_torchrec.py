"""Differential tests (issue 12): one quantized collection mixing table data types (FP32, FP16, INT8, INT4, INT2),
each table stored and looked up in its own type, equal to TorchRec 1.8's quantized collections."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.ao import quantization as quant

import rectoolkit as rtk
from rectoolkit.quant import QuantConfig, QuantEmbeddingBagCollection, QuantEmbeddingCollection

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

from torchrec.modules.embedding_configs import QuantConfig as TorchRecQuantConfig  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchRecQEBC  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingCollection as TorchRecQEC  # noqa: E402

BACKENDS = ["torch", pytest.param("fbgemm", marks=[pytest.mark.fbgemm, pytest.mark.skipif(
    not rtk.fbgemm_available(), reason="fbgemm_gpu not available")])]
# every storage type; the collection's default (INT8) for the tables not named, the first and the last, so the
# types interleave (TorchRec's quantized EC groups its state_dict and outputs by type)
PER_TABLE = {"t_fp32": torch.float32, "t_fp16": torch.float16, "t_int4": torch.quint4x2, "t_int2": torch.quint2x4}
ROWS = {"t_int8": 40, "t_fp32": 30, "t_fp16": 20, "t_int4": 50, "t_int2": 25, "t_int8_b": 35}
EXPECTED_TYPES = {"t_int8": "INT8", "t_fp32": "FP32", "t_fp16": "FP16", "t_int4": "INT4", "t_int2": "INT2",
                  "t_int8_b": "INT8"}


def _tables(lib, bags: bool, dim_of=lambda i: 8 * (i + 1)):
    config = lib.EmbeddingBagConfig if bags else lib.EmbeddingConfig
    return [config(name=name, num_embeddings=rows, embedding_dim=dim_of(i) if bags else 16, feature_names=[f"f_{name}"])
            for i, (name, rows) in enumerate(ROWS.items())]


def _qconfig(quant_config):
    return quant_config(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                        weight=quant.PlaceholderObserver.with_args(dtype=torch.int8), per_table_weight_dtype=PER_TABLE)


def _quantize(module, module_type, quant_type, qconfig):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quant.quantize_dynamic(torch.nn.Sequential(module), qconfig_spec={module_type: qconfig},
                                      mapping={module_type: quant_type}, inplace=False)[0]


def _inputs(seed: int, batch: int = 6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(ROWS) * batch,), generator=g)
    rows = [n for n in ROWS.values() for _ in range(batch)]
    values = torch.cat([torch.randint(0, n, (int(length),), generator=g) for n, length in zip(rows, lengths)])
    return dict(keys=[f"f_{name}" for name in ROWS], values=values, lengths=lengths)


def _raw(tensor):
    return getattr(tensor, "elem", tensor)  # TorchRec wraps INT4/INT2 rows in UInt4Tensor/UInt2Tensor


def _same_state(ours, theirs):
    ours_state, their_state = ours.state_dict(), theirs.state_dict()
    assert sorted(ours_state) == sorted(their_state)
    for key, value in ours_state.items():
        assert torch.equal(value, _raw(their_state[key])), key


def _ours_and_theirs(bags: bool, backend: str):
    """Our float collection, ours quantized with PER_TABLE, and TorchRec's quantized from the same weights."""
    ours_type, theirs_type = ((rtk.EmbeddingBagCollection, torchrec.EmbeddingBagCollection) if bags else
                              (rtk.EmbeddingCollection, torchrec.EmbeddingCollection))
    float_module = ours_type(_tables(rtk, bags))
    theirs_float = theirs_type(tables=_tables(torchrec, bags))
    theirs_float.load_state_dict(float_module.state_dict())
    theirs = _quantize(theirs_float, theirs_type, TorchRecQEBC if bags else TorchRecQEC, _qconfig(TorchRecQuantConfig))
    quant_type = QuantEmbeddingBagCollection if bags else QuantEmbeddingCollection
    ours = quant_type.from_float(float_module, dtype=torch.int8, per_table_weight_dtype=PER_TABLE, backend=backend)
    configs = ours.embedding_bag_configs() if bags else ours.embedding_configs()
    assert {t.name: t.data_type.value for t in configs} == EXPECTED_TYPES
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _same_state(ours, theirs)
    inputs = _inputs(seed=21)
    return (float_module, ours(rtk.KeyedJaggedTensor.from_lengths_sync(**inputs)),
            theirs(torchrec.KeyedJaggedTensor.from_lengths_sync(**inputs)), ours, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_quant_ebc_equals_torchrec(backend):
    ebc, out, expected, ours, theirs = _ours_and_theirs(bags=True, backend=backend)
    # the seed-001 path (quantize_dynamic with a per-table QuantConfig) stores the same bytes
    _same_state(_quantize(ebc, rtk.EmbeddingBagCollection, QuantEmbeddingBagCollection, _qconfig(QuantConfig)), theirs)
    assert out.keys() == expected.keys() and out.length_per_key() == expected.length_per_key()
    assert torch.equal(out.values(), expected.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_quant_ec_equals_torchrec(backend):
    _, out, expected, _, _ = _ours_and_theirs(bags=False, backend=backend)
    assert list(out) == list(expected)
    for key in out:  # per-id rows: each value is one dequantized stored value, so exactly TorchRec's
        assert torch.equal(out[key].values(), expected[key].values()), key
        assert torch.equal(out[key].lengths(), expected[key].lengths()), key


@pytest.mark.fbgemm
@pytest.mark.skipif(not rtk.fbgemm_available(), reason="fbgemm_gpu not available (TorchRec quantizes with its op)")
def test_torchrec_quantize_state_dict_of_mixed_types_builds_ours():
    # TorchRec's own quantizer, per-table types: its (codes, scale_bias) per table go into both constructors
    from torchrec.modules.embedding_configs import DataType as TorchRecDataType
    from torchrec.quant.embedding_modules import quantize_state_dict

    theirs_float = torchrec.EmbeddingBagCollection(tables=_tables(torchrec, bags=True))
    quantized_weights = {}
    quantize_state_dict(theirs_float, quantized_weights,
                        {name: TorchRecDataType[value] for name, value in EXPECTED_TYPES.items()})
    their_tables, our_tables = _tables(torchrec, bags=True), _tables(rtk, bags=True)
    for theirs_table, ours_table in zip(their_tables, our_tables):
        theirs_table.data_type = TorchRecDataType[EXPECTED_TYPES[theirs_table.name]]
        ours_table.data_type = rtk.DataType[EXPECTED_TYPES[ours_table.name]]
    theirs = TorchRecQEBC(their_tables, is_weighted=False, device=torch.device("cpu"),
                          table_name_to_quantized_weights=quantized_weights)
    ours = QuantEmbeddingBagCollection(our_tables, table_name_to_quantized_weights=quantized_weights, backend="torch")
    _same_state(ours, theirs)
    inputs = _inputs(seed=23)
    assert torch.equal(ours(rtk.KeyedJaggedTensor.from_lengths_sync(**inputs)).values(),
                       theirs(torchrec.KeyedJaggedTensor.from_lengths_sync(**inputs)).values())
