"""Pruned quantized tables (rectoolkit.quant.pruning) through the serving paths: both lookups, state_dict save /
load, torch.save, torch.export and its saved program, fx tracing; sharding refused. Expected values come from the
unpruned quantized model with the ids of pruned rows replaced by 0 by hand (TorchRec's behaviour, see
tests/inference/test_pruning_vs_torchrec.py)."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.inference.modules import quantize_inference_model, set_pruning_data, shard_quant_model
from rectoolkit.quant import QuantEmbeddingBagCollection, export_for_serving, save_for_serving

KEPT = {"t1": 3, "t2": 7}
BACKENDS = ["torch", pytest.param("fbgemm", marks=pytest.mark.skipif(not rtk.fbgemm_available(),
                                                                     reason="fbgemm_gpu not available"))]


def _ebc(weighted=False):
    torch.manual_seed(3)
    return rtk.EmbeddingBagCollection([
        rtk.EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=10, feature_names=["a", "b"]),
        rtk.EmbeddingBagConfig(name="t2", embedding_dim=16, num_embeddings=9, feature_names=["c"],
                               pooling=rtk.PoolingType.MEAN)], is_weighted=weighted)


def _kjt(ids, weighted=False):
    """Two samples per feature (a, b, c), one id per bag, ids as given."""
    return rtk.KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"], values=torch.tensor(ids), lengths=torch.ones(len(ids), dtype=torch.int64),
        weights=torch.linspace(0.5, 1.5, len(ids)) if weighted else None)


IDS = [0, 9, 2, 3, 6, 8]        # a: 0, 9 | b: 2, 3 | c: 6, 8   (9, 3 pruned in t1; 8 pruned in t2)
IDS_HAND = [0, 0, 2, 0, 6, 0]   # the same with the pruned ids replaced by 0


def _pruned_and_whole(dtype=torch.int8, weighted=False, backend="auto"):
    ebc = _ebc(weighted)
    whole = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend=backend)
    set_pruning_data(torch.nn.Sequential(ebc), KEPT)
    pruned = QuantEmbeddingBagCollection.from_float(ebc, dtype=dtype, backend=backend)
    return pruned, whole


def _quiet_call(module, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module(*args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.float16])
@pytest.mark.parametrize("weighted", [False, True])
def test_pruned_ids_read_row_zero_on_both_lookups(backend, dtype, weighted):
    pruned, whole = _pruned_and_whole(dtype, weighted, backend)
    assert pruned.backend == (backend if backend != "auto" else pruned.backend)
    got = _quiet_call(pruned, _kjt(IDS, weighted)).values()
    torch.testing.assert_close(got, whole(_kjt(IDS_HAND, weighted)).values(), rtol=1e-6, atol=1e-6)
    # the stored rows are the first rows of the whole table, byte for byte
    for name, rows in KEPT.items():
        assert torch.equal(pruned.embedding_bags[name].weight, whole.embedding_bags[name].weight[:rows])


def test_state_dict_loads_into_a_collection_built_from_the_pruned_configs():
    pruned, _ = _pruned_and_whole()
    configs = pruned.embedding_bag_configs()
    assert [(c.num_embeddings, c.num_embeddings_post_pruning) for c in configs] == [(10, 3), (9, 7)]
    fresh = QuantEmbeddingBagCollection(copy.deepcopy(configs))
    assert fresh.storage_bytes() == pruned.storage_bytes()
    fresh.load_state_dict(pruned.state_dict())
    torch.testing.assert_close(_quiet_call(fresh, _kjt(IDS)).values(), _quiet_call(pruned, _kjt(IDS)).values())
    buffer = io.BytesIO()
    torch.save(pruned, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(_quiet_call(loaded, _kjt(IDS)).values(), _quiet_call(pruned, _kjt(IDS)).values())


def test_torch_export_and_saved_program_keep_the_pruning(tmp_path):
    pruned, whole = _pruned_and_whole()
    example = _kjt(IDS)
    program = export_for_serving(pruned, example)
    expected = whole(_kjt(IDS_HAND)).values()
    torch.testing.assert_close(program.module()(example.values(), example.lengths()), expected)
    path = str(tmp_path / "pruned.pt2")
    save_for_serving(program, path)
    loaded = torch.export.load(path).module()
    other = _kjt([1, 5, 9, 0, 8, 2])  # another batch: pruned ids elsewhere
    torch.testing.assert_close(loaded(other.values(), other.lengths()), whole(_kjt([1, 0, 0, 0, 0, 2])).values())


def test_fx_trace_of_a_pruned_model():
    model = torch.nn.Sequential(_ebc())
    whole = quantize_inference_model(copy.deepcopy(model))
    quantize_inference_model(set_pruning_data(model, KEPT))
    traced = rtk.fx.symbolic_trace(model)
    torch.testing.assert_close(_quiet_call(traced, _kjt(IDS)).values(), whole(_kjt(IDS_HAND)).values())


def test_memory_shrinks_by_the_pruned_rows():
    pruned, whole = _pruned_and_whole(torch.float32)
    assert whole.storage_bytes() - pruned.storage_bytes() == (10 - 3) * 8 * 4 + (9 - 7) * 16 * 4


def test_sharding_a_pruned_table_is_refused():
    model = quantize_inference_model(set_pruning_data(torch.nn.Sequential(_ebc()), KEPT))
    with pytest.raises(NotImplementedError, match=r"tables \['t1', 't2'\] are pruned"):
        shard_quant_model(model, compute_device="cpu", sharding_device="cpu")


def test_pruned_config_values_are_checked():
    table = rtk.EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=10, num_embeddings_post_pruning=11)
    with pytest.raises(ValueError, match=r"table 't': num_embeddings_post_pruning=11 must be an int in 1..num_emb"):
        QuantEmbeddingBagCollection([table])
    with pytest.raises(ValueError, match="keeps every row"):
        rtk.quant.QuantEmbeddingCollection([rtk.EmbeddingConfig(name="s", embedding_dim=8, num_embeddings=10,
                                                                num_embeddings_post_pruning=4)])


def test_an_empty_batch_of_a_pruned_collection():
    pruned, _ = _pruned_and_whole()
    empty = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["a", "b", "c"], values=torch.tensor([], dtype=torch.int64),
                                                    lengths=torch.tensor([], dtype=torch.int64))
    assert pruned(empty).values().shape == (0, 8 + 8 + 16)
