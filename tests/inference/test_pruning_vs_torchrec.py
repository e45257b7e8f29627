"""Differential tests: set_pruning_data -> quantize_inference_model, and assign_weights_to_tbe, against TorchRec 1.8
on the same float weights and inputs (TorchRec's quantized lookup runs on CPU here, fbgemm-gpu-cpu)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.inference.modules import (
    assign_weights_to_tbe,
    get_table_to_weights_from_tbe,
    quantize_inference_model,
    set_pruning_data,
)
from rectoolkit.quant import bytes_per_table

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

from torchrec.inference import modules as trec_inference  # noqa: E402

DTYPES = [torch.int8, torch.quint4x2, torch.quint2x4, torch.float16, torch.float32]
PRUNING = {"t1": 4, "t2": 5}


class _Model(torch.nn.Module):
    def __init__(self, lib, weighted: bool = False):
        super().__init__()
        self.ebc = lib.EmbeddingBagCollection(tables=[
            lib.EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=10, feature_names=["f1", "f3"]),
            lib.EmbeddingBagConfig(name="t2", embedding_dim=16, num_embeddings=12, feature_names=["f2"],
                                   pooling=lib.PoolingType.MEAN),
            lib.EmbeddingBagConfig(name="t3", embedding_dim=8, num_embeddings=6, feature_names=["f4"])],
            is_weighted=weighted, device=torch.device("cpu"))

    def forward(self, kjt):
        return self.ebc(kjt).to_dict()  # by key: TorchRec orders a mixed SUM / MEAN collection's keys by pooling


def _pair(weighted=False, seed=0):
    torch.manual_seed(seed)
    ours = _Model(rtk, weighted)
    theirs = _Model(torchrec, weighted)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _batch(lib, seed, batch=6, weighted=False):
    """Ids over the whole table (pruned rows included), empty bags included."""
    g = torch.Generator().manual_seed(seed)
    rows = {"f1": 10, "f2": 12, "f3": 10, "f4": 6}
    lengths = torch.randint(0, 4, (4 * batch,), generator=g)
    sizes = [rows[f] for f in rows for _ in range(batch)]
    values = torch.cat([torch.randint(0, n, (int(k),), generator=g) for n, k in zip(sizes, lengths)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return lib.KeyedJaggedTensor.from_lengths_sync(keys=list(rows), values=values, lengths=lengths, weights=weights)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _assert_same(got, expected):
    assert list(got) == sorted(expected, key=list(got).index)
    for key in got:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-5)


def _raw(tensor):
    return getattr(tensor, "elem", tensor)  # TorchRec wraps INT4/INT2 rows in UInt4Tensor/UInt2Tensor


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
def test_pruned_model_equals_torchrec(dtype, weighted):
    ours, theirs = _pair(weighted)
    set_pruning_data(ours, PRUNING)
    trec_inference.set_pruning_data(theirs, PRUNING)
    _quiet(quantize_inference_model, ours, quantization_dtype=dtype)
    _quiet(trec_inference.quantize_inference_model, theirs, quantization_dtype=dtype)
    # the stored rows: TorchRec's bytes, the first rows of each pruned table only
    theirs_state = theirs.state_dict()
    for name, weight in ours.state_dict().items():
        assert torch.equal(weight, _raw(theirs_state[name])), name
    assert ours.ebc.embedding_bags["t1"].weight.shape[0] == 4 and ours.ebc.embedding_bags["t2"].weight.shape[0] == 5
    for seed in range(3):
        batch_ours, batch_theirs = _batch(rtk, seed, weighted=weighted), _batch(torchrec, seed, weighted=weighted)
        assert (batch_ours.values() >= 4).any()  # ids of pruned rows are in the batch
        with pytest.warns(UserWarning, match="pruned rows read row 0"):
            got = ours(batch_ours)
        _assert_same(got, _quiet(theirs, batch_theirs))


def test_pruning_shrinks_memory_by_the_pruned_rows():
    pruned, _ = _pair()
    whole = copy.deepcopy(pruned)
    quantize_inference_model(set_pruning_data(pruned, PRUNING))
    quantize_inference_model(whole)
    # INT8 rows padded to 16 bytes: t1 8 + 4 -> 16, t2 16 + 4 -> 32 bytes a row
    pruned_bytes = (10 - 4) * 16 + (12 - 5) * 32
    assert whole.ebc.storage_bytes() - pruned.ebc.storage_bytes() == pruned_bytes
    assert bytes_per_table(pruned.ebc) == {"t1": 4 * 16, "t2": 5 * 32, "t3": 6 * 16}
    assert bytes_per_table(whole.ebc) == {"t1": 10 * 16, "t2": 12 * 32, "t3": 6 * 16}
    assert sum(w.numel() for w in pruned.state_dict().values()) == pruned.ebc.storage_bytes()


def test_ids_of_kept_rows_read_the_same_rows_as_unpruned():
    pruned, _ = _pair()
    whole = copy.deepcopy(pruned)
    quantize_inference_model(set_pruning_data(pruned, PRUNING))
    quantize_inference_model(whole)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f1", "f2", "f3", "f4"], values=torch.tensor([3, 0, 4, 2, 5]),
                                                  lengths=torch.tensor([1, 2, 1, 1]))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*pruned rows")  # no id of a pruned row: no warning
        _assert_same(pruned(kjt), whole(kjt))
    # a pruned id reads row 0 (hand check against the unpruned model)
    pruned_ids = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f1", "f2", "f3", "f4"],
                                                         values=torch.tensor([9, 11, 0, 5]),
                                                         lengths=torch.tensor([1, 1, 1, 1]))
    row_zero = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f1", "f2", "f3", "f4"], values=torch.tensor([0, 0, 0, 5]),
                                                       lengths=torch.tensor([1, 1, 1, 1]))
    with pytest.warns(UserWarning, match=r"feature 'f1' \(table 't1' keeps rows 0..3 of 10\)"):
        got = pruned(pruned_ids)
    _assert_same(got, whole(row_zero))


def test_ids_past_the_table_are_still_refused():
    model, _ = _pair()
    quantize_inference_model(set_pruning_data(model, PRUNING))
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f1", "f2", "f3", "f4"], values=torch.tensor([10, 0, 0, 0]),
                                                  lengths=torch.tensor([1, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"id 10 of feature 'f1' \(sample 0\) is out of range for table 't1'"):
        model(kjt)


def test_set_pruning_data_refuses_what_would_prune_nothing_or_fail_later():
    model, _ = _pair()
    with pytest.raises(ValueError, match=r"tables \['t9'\] are no tables"):
        set_pruning_data(model, {"t9": 3})
    with pytest.raises(ValueError, match="keep more rows than the tables have"):
        set_pruning_data(model, {"t1": 11})
    with pytest.raises(ValueError, match=r"tables_to_rows_post_pruning\['t1'\] = 0"):
        set_pruning_data(model, {"t1": 0})
    assert set_pruning_data(model, {"t1": 10}) is model  # keeping every row is allowed (and changes nothing)


def test_quantized_embedding_collection_refuses_pruning():
    # TorchRec 1.8's quantized EmbeddingCollection ignores the pruning data and keeps every row
    model = torch.nn.Sequential(torchrec.EmbeddingCollection(tables=[
        torchrec.EmbeddingConfig(name="s", embedding_dim=8, num_embeddings=10, feature_names=["g"])]))
    trec_inference.set_pruning_data(model, {"s": 4}, module_types=[torchrec.EmbeddingCollection])
    _quiet(trec_inference.quantize_inference_model, model)
    assert model[0].embeddings["s"].weight.shape[0] == 10
    ours = torch.nn.Sequential(rtk.EmbeddingCollection(tables=[
        rtk.EmbeddingConfig(name="s", embedding_dim=8, num_embeddings=10, feature_names=["g"])]))
    set_pruning_data(ours, {"s": 4}, module_types=[rtk.EmbeddingCollection])
    with pytest.raises(ValueError, match=r"names tables \['s'\] of an EmbeddingCollection"):
        quantize_inference_model(ours)


def _random_tbe_weights(table_to_weight, seed):
    """Random stored rows shaped as the TBE's: random codes, fp16 scale and bias from random floats."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (weight, scale_bias) in table_to_weight.items():
        codes = torch.randint(0, 256, tuple(weight.shape), generator=g, dtype=torch.uint8)
        if scale_bias is None:  # FP16 / FP32 rows: the bytes of random floats
            floats = torch.rand(weight.shape[0], weight.shape[1] // 2, generator=g).half()
            out[name] = (floats.view(torch.uint8).reshape(weight.shape).contiguous(), None)
            continue
        scale_bias_values = (torch.rand(scale_bias.shape[0], 2, generator=g) - 0.5).half()
        out[name] = (codes, scale_bias_values.view(torch.uint8).contiguous())
    return out


@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.float16])
@pytest.mark.parametrize("pruned", [False, True])
def test_assign_weights_to_tbe_equals_torchrec(dtype, pruned):
    ours, theirs = _pair(weighted=True, seed=1)
    if pruned:
        set_pruning_data(ours, PRUNING)
        trec_inference.set_pruning_data(theirs, PRUNING)
    _quiet(quantize_inference_model, ours, quantization_dtype=dtype)
    _quiet(trec_inference.quantize_inference_model, theirs, quantization_dtype=dtype)
    theirs_weights = trec_inference.get_table_to_weights_from_tbe(theirs)
    ours_weights = get_table_to_weights_from_tbe(ours)
    assert {n: [None if t is None else (tuple(t.shape), t.dtype) for t in w] for n, w in ours_weights.items()} == \
        {n: [None if t is None else (tuple(t.shape), t.dtype) for t in w] for n, w in theirs_weights.items()}
    assigned = _random_tbe_weights(theirs_weights, seed=7)
    assign_weights_to_tbe(ours, assigned)
    trec_inference.assign_weights_to_tbe(theirs, assigned)
    theirs_state = theirs.state_dict()
    for name, weight in ours.state_dict().items():
        assert torch.equal(weight, _raw(theirs_state[name])), name
    kept = {"f1": 4, "f2": 5, "f3": 4, "f4": 6} if pruned else {"f1": 10, "f2": 12, "f3": 10, "f4": 6}
    values = torch.tensor([0, kept["f1"] - 1, 1, kept["f2"] - 1, 2, kept["f4"] - 1, 3])
    args = dict(keys=list(kept), values=values, lengths=torch.tensor([2, 0, 1, 1, 0, 1, 2, 0]),
                weights=torch.linspace(0.5, 2.0, 7))
    _assert_same(ours(rtk.KeyedJaggedTensor.from_lengths_sync(**args)),
                 _quiet(theirs, torchrec.KeyedJaggedTensor.from_lengths_sync(**args)))


def test_assign_weights_to_tbe_errors_name_the_table():
    model, _ = _pair()
    quantize_inference_model(model)
    weights = get_table_to_weights_from_tbe(model)
    with pytest.raises(AssertionError, match=r"tables \['t3'\] not in table_to_weight"):
        assign_weights_to_tbe(model, {k: v for k, v in weights.items() if k != "t3"})
    short = dict(weights, t2=(weights["t2"][0][:3], weights["t2"][1][:3]))
    with pytest.raises(ValueError, match=r"table 't2' \(INT8\): weight must be uint8 \(12, 16\)"):
        assign_weights_to_tbe(model, short)
    with pytest.raises(ValueError, match=r"table 't1' \(INT8\): scale_bias must be given"):
        assign_weights_to_tbe(model, dict(weights, t1=(weights["t1"][0], None)))


def test_constructor_with_pruned_configs_and_torchrec_weights_equals_torchrec():
    _, theirs = _pair(seed=2)
    trec_inference.set_pruning_data(theirs, PRUNING)
    _quiet(trec_inference.quantize_inference_model, theirs, quantization_dtype=torch.quint4x2)
    configs = [rtk.EmbeddingBagConfig(
        name=c.name, embedding_dim=c.embedding_dim, num_embeddings=c.num_embeddings, feature_names=list(c.feature_names),
        data_type=c.data_type.value, pooling=c.pooling.value, num_embeddings_post_pruning=c.num_embeddings_post_pruning)
        for c in theirs.ebc.embedding_bag_configs()]
    assert [c.num_embeddings_post_pruning for c in configs] == [4, 5, None]
    weights = {name: (w.clone(), sb.clone()) for name, (w, sb) in
               trec_inference.get_table_to_weights_from_tbe(theirs).items()}
    ours = rtk.quant.QuantEmbeddingBagCollection(configs, table_name_to_quantized_weights=weights)
    for seed in (5, 6):
        with pytest.warns(UserWarning, match="pruned rows read row 0"):
            got = ours(_batch(rtk, seed)).to_dict()
        _assert_same(got, _quiet(theirs, _batch(torchrec, seed)))


def test_the_pruning_attribute_is_torchrecs():
    from torchrec.quant import embedding_modules as theirs

    from rectoolkit.quant import embedding_modules as ours
    assert ours.MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT == \
        theirs.MODULE_ATTR_EMB_CONFIG_NAME_TO_NUM_ROWS_POST_PRUNING_DICT
    # a float collection marked by TorchRec's set_pruning_data is pruned by rectoolkit's quantization
    ours_model, _ = _pair()
    trec_inference.set_pruning_data(ours_model, PRUNING, module_types=[rtk.EmbeddingBagCollection])
    quantize_inference_model(ours_model)
    assert [ours_model.ebc.embedding_bags[t].weight.shape[0] for t in ("t1", "t2", "t3")] == [4, 5, 6]

