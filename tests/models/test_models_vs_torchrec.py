"""DLRM, DLRM_DCN and SimpleDeepFMNN at TorchRec's paths: the same state_dict keys as TorchRec 1.8's models,
and the same outputs when TorchRec's weights are loaded into ours."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.models import DLRM, DLRM_DCN, SimpleDeepFMNN


def _tables(lib):
    return [lib.EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4, feature_names=["f0", "f1"]),
            lib.EmbeddingBagConfig(name="t1", num_embeddings=9, embedding_dim=4, feature_names=["f2"])]


def _sparse(lib):
    lengths = torch.tensor([1, 2, 0, 3, 1, 1])  # batch 2, keys f0 f1 f2
    return lib.KeyedJaggedTensor.from_lengths_sync(["f0", "f1", "f2"], torch.tensor([3, 4, 19, 0, 1, 2, 8, 5]), lengths)


@pytest.mark.parametrize("name", ["rectoolkit.models.dlrm", "rectoolkit.models.deepfm"])
def test_docstring_examples(name):
    assert doctest.testmod(importlib.import_module(name)).failed == 0


def test_dlrm_dcn_interaction_is_a_crossnet_over_dense_and_pooled_vectors():
    torch.manual_seed(0)
    model = DLRM_DCN(rtk.EmbeddingBagCollection(_tables(rtk)), 3, [8, 4], [6, 1], dcn_num_layers=1, dcn_low_rank_dim=2)
    dense, sparse = torch.randn(2, 4), torch.randn(2, 3, 4)
    crossnet = model.inter_arch.crossnet
    x0 = torch.cat([dense, sparse.flatten(1)], dim=1)  # [dense, f0, f1, f2] per sample, 16 wide
    w, v, b = crossnet.W_kernels[0], crossnet.V_kernels[0], crossnet.bias[0]
    expected = torch.stack([x0[i] * (w @ (v @ x0[i]) + b) + x0[i] for i in range(2)])
    torch.testing.assert_close(model.inter_arch(dense, sparse), expected)


def test_simple_deepfm_refuses_mixed_dims():
    mixed = [_tables(rtk)[0], rtk.EmbeddingBagConfig(name="t9", num_embeddings=3, embedding_dim=8, feature_names=["g"])]
    with pytest.raises(ValueError, match=r"same embedding_dim, got \{'t0': 4, 't9': 8\}"):
        SimpleDeepFMNN(3, rtk.EmbeddingBagCollection(mixed), hidden_layer_size=5, deep_fm_dimension=2)


def test_over_arch_needs_two_sizes():
    with pytest.raises(ValueError, match=r"over_arch_layer_sizes=\[1\] needs at least two sizes"):
        DLRM(rtk.EmbeddingBagCollection(_tables(rtk)), 3, [8, 4], [1])


def _build(kind, lib, models):
    ebc = lib.EmbeddingBagCollection(tables=_tables(lib))
    if kind == "DLRM":
        return models.dlrm.DLRM(ebc, 3, [8, 4], [16, 8, 1])
    if kind == "DLRM_DCN":
        return models.dlrm.DLRM_DCN(ebc, 3, [8, 4], [16, 8, 1], dcn_num_layers=2, dcn_low_rank_dim=3)
    return models.deepfm.SimpleDeepFMNN(3, ebc, hidden_layer_size=6, deep_fm_dimension=5)


@pytest.mark.torchrec
@pytest.mark.parametrize("kind", ["DLRM", "DLRM_DCN", "SimpleDeepFMNN"])
def test_same_keys_and_outputs_as_torchrec(kind):
    pytest.importorskip("torchrec")
    import torchrec.models.deepfm  # TorchRec's package does not import its models
    import torchrec.models.dlrm  # noqa: F401
    import rectoolkit.models.deepfm  # noqa: F401
    import rectoolkit.models.dlrm  # noqa: F401

    torch.manual_seed(0)
    theirs = _build(kind, torchrec, torchrec.models)
    with torch.no_grad():  # TorchRec's cross-net biases start at zero: make them matter
        for name, parameter in theirs.named_parameters():
            if "bias" in name:
                parameter.normal_()
    ours = _build(kind, rtk, rtk.models)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    dense = torch.randn(2, 3)
    torch.testing.assert_close(ours(dense, _sparse(rtk)), theirs(dense, _sparse(torchrec)))
