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
    if kind == "DLRM_Projection":
        return models.dlrm.DLRM_Projection(ebc, 3, [8, 4], [16, 8, 1], interaction_branch1_layer_sizes=[8, 8],
                                           interaction_branch2_layer_sizes=[6, 12])
    return models.deepfm.SimpleDeepFMNN(3, ebc, hidden_layer_size=6, deep_fm_dimension=5)


@pytest.mark.torchrec
@pytest.mark.parametrize("kind", ["DLRM", "DLRM_DCN", "DLRM_Projection", "SimpleDeepFMNN"])
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


def _torchrec_models():
    pytest.importorskip("torchrec")
    import torchrec.models.deepfm  # TorchRec's package does not import its models
    import torchrec.models.dlrm  # noqa: F401

    return torchrec


@pytest.mark.torchrec
@pytest.mark.parametrize("kind", ["DLRM", "DLRM_DCN", "DLRM_Projection"])
def test_torchrec_keyword_call_with_dense_device_a_batch_of_one_and_keys_in_another_order(kind):
    torchrec = _torchrec_models()
    extra = {"DLRM": {}, "DLRM_DCN": dict(dcn_num_layers=1, dcn_low_rank_dim=2),
             "DLRM_Projection": dict(interaction_branch1_layer_sizes=[4], interaction_branch2_layer_sizes=[8])}[kind]

    def build(lib, models):
        torch.manual_seed(0)
        return getattr(models.dlrm, kind)(embedding_bag_collection=lib.EmbeddingBagCollection(tables=_tables(lib)),
                                          dense_in_features=3, dense_arch_layer_sizes=[5, 4],
                                          over_arch_layer_sizes=[3, 1], dense_device=torch.device("cpu"), **extra)

    theirs, ours = build(torchrec, torchrec.models), build(rtk, rtk.models)
    ours.load_state_dict(theirs.state_dict())
    assert (ours.sparse_arch.F, ours.sparse_arch.D) == (theirs.sparse_arch.F, theirs.sparse_arch.D) == (3, 4)
    assert ours.sparse_arch.sparse_feature_names == theirs.sparse_arch.sparse_feature_names
    dense = torch.randn(1, 3)

    def sparse(lib):  # one sample, the KJT's keys in another order than the tables'
        return lib.KeyedJaggedTensor.from_lengths_sync(["f2", "f0", "f1"], torch.tensor([8, 3, 4, 19]),
                                                       torch.tensor([1, 2, 1]))

    torch.testing.assert_close(ours(dense_features=dense, sparse_features=sparse(rtk)),
                               theirs(dense_features=dense, sparse_features=sparse(torchrec)))


@pytest.mark.torchrec
def test_dlrm_train_loss_and_detached_outputs_equal_torchrecs():
    torchrec = _torchrec_models()
    from torchrec.datasets.utils import Batch as TheirBatch

    from rectoolkit.datasets.utils import Batch
    from rectoolkit.models.dlrm import DLRMTrain

    theirs = torchrec.models.dlrm.DLRMTrain(_build("DLRM", torchrec, torchrec.models))
    ours = DLRMTrain(_build("DLRM", rtk, rtk.models))
    ours.load_state_dict(theirs.state_dict())
    dense, labels = torch.randn(2, 3), torch.tensor([1, 0])
    their_loss, their_out = theirs(TheirBatch(dense, _sparse(torchrec), labels))
    our_loss, our_out = ours(Batch(dense, _sparse(rtk), labels))
    torch.testing.assert_close(our_loss, their_loss)
    for got, expected in zip(our_out, their_out):
        torch.testing.assert_close(got, expected)
        assert not got.requires_grad
    assert our_loss.requires_grad


def test_dlrm_projection_refuses_a_branch_that_is_not_a_multiple_of_the_dim():
    with pytest.raises(ValueError, match=r"interaction_branch2_layer_sizes=\[6, 10\] must end in a multiple of the "
                                         r"tables' embedding_dim=4, e.g. \[6, 8\]"):
        rtk.models.DLRM_Projection(rtk.EmbeddingBagCollection(_tables(rtk)), 3, [8, 4], [4, 1], [8], [6, 10])


@pytest.mark.torchrec
def test_arches_take_torchrecs_keyword_names():
    torchrec = _torchrec_models()
    theirs, ours = _build("DLRM", torchrec, torchrec.models), _build("DLRM", rtk, rtk.models)
    ours.load_state_dict(theirs.state_dict())
    dense, sparse = torch.randn(2, 4), torch.randn(2, 3, 4)
    torch.testing.assert_close(ours.inter_arch(dense_features=dense, sparse_features=sparse),
                               theirs.inter_arch(dense_features=dense, sparse_features=sparse))
    features = torch.randn(2, 3)
    torch.testing.assert_close(ours.dense_arch(features=features), theirs.dense_arch(features=features))


def test_compile_dense_path_compiles_the_three_dense_arches_once(monkeypatch):
    compiled = []

    def fake_compile(module, mode):  # records the call; the module runs as it is
        compiled.append((type(module).__name__, mode))
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = _build("DLRM", rtk, rtk.models)
    dense = torch.randn(2, 3)
    before = model(dense, _sparse(rtk))
    model.compile_dense_path(compile_mode="default")
    model.compile_dense_path()
    assert compiled == [("DenseArch", "default"), ("InteractionArch", "default"), ("OverArch", "default")]
    torch.testing.assert_close(model(dense, _sparse(rtk)), before)


@pytest.mark.torchrec
@pytest.mark.parametrize("kind", ["DLRM", "DLRM_DCN", "DLRM_Projection", "SimpleDeepFMNN"])
def test_torch_fx_traces_the_models_as_torchrecs(kind):
    import torch.fx

    torchrec = _torchrec_models()
    theirs, ours = _build(kind, torchrec, torchrec.models), _build(kind, rtk, rtk.models)
    ours.load_state_dict(theirs.state_dict())
    traced = torch.fx.symbolic_trace(ours)
    dense = torch.randn(2, 3)
    expected = torch.fx.symbolic_trace(theirs)(dense, _sparse(torchrec))
    torch.testing.assert_close(traced(dense, _sparse(rtk)), expected)
    torch.testing.assert_close(ours(dense, _sparse(rtk)), expected)


def _wrapper(lib, models, kind):
    ebc = lib.EmbeddingBagCollection(tables=_tables(lib))
    if kind == "DLRMWrapper":
        return models.dlrm.DLRMWrapper(ebc, 3, [8, 4], [16, 8, 1])
    return models.deepfm.SimpleDeepFMNNWrapper(3, ebc, hidden_layer_size=6, deep_fm_dimension=5)


@pytest.mark.torchrec
@pytest.mark.parametrize("kind", ["DLRMWrapper", "SimpleDeepFMNNWrapper"])
@pytest.mark.parametrize("training", [True, False])
def test_wrappers_take_torchrecs_model_input_and_give_its_loss_and_prediction(training, kind):
    pytest.importorskip("torchrec")
    import torchrec.models.deepfm
    import torchrec.models.dlrm
    from torchrec.distributed.test_utils.model_input import ModelInput

    import rectoolkit.models

    torch.manual_seed(0)
    theirs = _wrapper(torchrec, torchrec.models, kind)
    ours = _wrapper(rtk, rectoolkit.models, kind)
    ours.load_state_dict(theirs.state_dict())
    ours.train(training)
    theirs.train(training)
    dense, label = torch.randn(2, 3), torch.tensor([1.0, 0.0])
    got = ours(ModelInput(float_features=dense, idlist_features=_sparse(rtk), idscore_features=None, label=label))
    expected = theirs(ModelInput(float_features=dense, idlist_features=_sparse(torchrec), idscore_features=None,
                                 label=label))
    if training:
        torch.testing.assert_close(got[0], expected[0])
        torch.testing.assert_close(got[1], expected[1])
        logits = expected[1].squeeze()  # the loss by hand, from TorchRec's prediction taken as logits
        by_hand = -(label * torch.log(torch.sigmoid(logits)) + (1 - label) * torch.log(1 - torch.sigmoid(logits)))
        torch.testing.assert_close(got[0], by_hand.mean())
    else:
        torch.testing.assert_close(got, expected)


def test_dlrm_wrapper_names_a_missing_field():
    import rectoolkit.models.deepfm
    import rectoolkit.models.dlrm

    model = rectoolkit.models.dlrm.DLRMWrapper(rtk.EmbeddingBagCollection(_tables(rtk)), 3, [8, 4], [16, 8, 1])
    with pytest.raises(TypeError, match="has no 'label'"):
        model(type("Batch", (), {"float_features": torch.randn(2, 3), "idlist_features": _sparse(rtk)})())
    deepfm = rectoolkit.models.deepfm.SimpleDeepFMNNWrapper(3, rtk.EmbeddingBagCollection(_tables(rtk)), 6, 5)
    with pytest.raises(ValueError, match="SimpleDeepFMNNWrapper: model_input.idlist_features is None"):
        deepfm(type("Batch", (), {"float_features": torch.randn(2, 3), "idlist_features": None, "label": None})())
