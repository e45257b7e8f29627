"""torch.fx.symbolic_trace / rectoolkit.fx.symbolic_trace of a model holding a FeatureProcessedEmbeddingBagCollection
built with a dict of PositionWeightedModule per feature: it traces where TorchRec 1.8's does, the traced module
gives TorchRec's traced output with the same weights and the eager output, and keeps TorchRec's state_dict keys."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.fx

import rectoolkit as rtk
import rectoolkit.fx

torchrec = pytest.importorskip("torchrec")
torchrec_fx = pytest.importorskip("torchrec.fx")
pytestmark = pytest.mark.torchrec


class Model(torch.nn.Module):
    def __init__(self, fp_ebc):
        super().__init__()
        self.fp_ebc = fp_ebc

    def forward(self, features):
        pooled = self.fp_ebc(features)
        return pooled.values(), pooled["f2"]


def model(lib):
    fp = importlib.import_module(lib.__name__ + ".modules.feature_processor_")
    fp_modules = importlib.import_module(lib.__name__ + ".modules.fp_embedding_modules")
    tables = [lib.EmbeddingBagConfig(name="t1", num_embeddings=20, embedding_dim=4, feature_names=["f1", "f3"]),
              lib.EmbeddingBagConfig(name="t2", num_embeddings=12, embedding_dim=4, feature_names=["f2"])]
    ebc = lib.EmbeddingBagCollection(tables=tables, is_weighted=True)
    processors = {name: fp.PositionWeightedModule(max_feature_length=3) for name in ["f1", "f2", "f3"]}
    return Model(fp_modules.FeatureProcessedEmbeddingBagCollection(ebc, processors))


def features(lib):
    return lib.KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2", "f3"], values=torch.tensor([3, 19 % 12, 0, 11, 11, 5, 7, 2, 9]),
        lengths=torch.tensor([2, 0, 1, 1, 2, 0, 1, 2, 0]))


def models_with_the_same_weights():
    torch.manual_seed(0)
    ours, theirs = model(rtk), model(torchrec)
    state = {name: torch.randn_like(tensor) for name, tensor in theirs.state_dict().items()}
    theirs.load_state_dict(state)
    ours.load_state_dict(state)
    return ours, theirs


@pytest.mark.parametrize("trace", ["torch", "fx"])
def test_traced_dict_form_gives_torchrecs_traced_output_and_eager(trace):
    ours, theirs = models_with_the_same_weights()
    ours_traced = torch.fx.symbolic_trace(ours) if trace == "torch" else rectoolkit.fx.symbolic_trace(ours)
    theirs_traced = torch.fx.symbolic_trace(theirs) if trace == "torch" else torchrec_fx.symbolic_trace(theirs)
    expected = theirs_traced(features(torchrec))
    for got in (ours_traced(features(rtk)), ours(features(rtk))):
        for mine, reference in zip(got, expected, strict=True):
            torch.testing.assert_close(mine, reference)
    assert sorted(ours_traced.state_dict()) == sorted(theirs_traced.state_dict())


def test_traced_dict_form_names_a_missing_feature_when_run():
    ours, _ = models_with_the_same_weights()
    traced = torch.fx.symbolic_trace(ours)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f1", "f3"], torch.tensor([1, 2]), torch.tensor([1, 0, 1, 0]))
    with pytest.raises(ValueError, match=r"but not \['f2'\]"):
        traced(kjt)
