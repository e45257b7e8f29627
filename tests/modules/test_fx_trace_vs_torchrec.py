"""torch.fx.symbolic_trace of the unsharded collections (float and quantized) and of KJT code, where TorchRec 1.8's
traces too: the traced graphs give TorchRec's traced outputs, and the untraced ones; the GraphModule keeps the
tables under TorchRec's state_dict keys."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx
from torch.ao import quantization as quant

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

from torchrec.modules.embedding_configs import QuantConfig as TorchRecQuantConfig  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchRecQEBC  # noqa: E402
from torchrec.quant.embedding_modules import EmbeddingCollection as TorchRecQEC  # noqa: E402


def bag_tables(lib):
    return [lib.EmbeddingBagConfig(name="t1", num_embeddings=20, embedding_dim=8, feature_names=["f1", "f3"]),
            lib.EmbeddingBagConfig(name="t2", num_embeddings=12, embedding_dim=4, feature_names=["f2"],
                                   pooling=lib.PoolingType.MEAN)]


def sequence_tables(lib):
    return [lib.EmbeddingConfig(name="t1", num_embeddings=20, embedding_dim=8, feature_names=["f1", "f3"]),
            lib.EmbeddingConfig(name="t2", num_embeddings=12, embedding_dim=8, feature_names=["f2"])]


def kjt(lib):
    return lib.KeyedJaggedTensor.from_lengths_sync(
        keys=["f1", "f2", "f3"], values=torch.tensor([3, 19, 0, 11, 11, 5, 7, 2, 9]),
        lengths=torch.tensor([2, 0, 1, 1, 2, 0, 1, 2, 0]))


def quantize(module, module_type, quant_type):
    qconfig = TorchRecQuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
                                  weight=quant.PlaceholderObserver.with_args(dtype=torch.int8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quant.quantize_dynamic(torch.nn.Sequential(module), qconfig_spec={module_type: qconfig},
                                      mapping={module_type: quant_type}, inplace=False)[0]


def pairs(kind):
    """(ours, TorchRec's) with the same weights."""
    torch.manual_seed(0)
    if kind in ("ebc", "qebc"):
        ours = rtk.EmbeddingBagCollection(bag_tables(rtk))
        theirs = torchrec.EmbeddingBagCollection(tables=bag_tables(torchrec))
    else:
        ours = rtk.EmbeddingCollection(sequence_tables(rtk))
        theirs = torchrec.EmbeddingCollection(tables=sequence_tables(torchrec))
    theirs.load_state_dict(ours.state_dict())
    if kind == "qebc":
        return (QuantEmbeddingBagCollection.from_float(ours, dtype=torch.int8),
                quantize(theirs, torchrec.EmbeddingBagCollection, TorchRecQEBC))
    if kind == "qec":
        return (QuantEmbeddingCollection.from_float(ours, dtype=torch.int8),
                quantize(theirs, torchrec.EmbeddingCollection, TorchRecQEC))
    return ours, theirs


def as_tensors(output):
    if isinstance(output, (rtk.KeyedTensor, torchrec.KeyedTensor)):
        return {"values": output.values()}
    return {name: (jt.values(), jt.lengths()) for name, jt in output.items()}


def assert_same(ours, theirs):
    ours, theirs = as_tensors(ours), as_tensors(theirs)
    assert list(ours) == list(theirs)
    for (key, a), b in zip(ours.items(), theirs.values()):
        a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize("kind", ["ebc", "ec", "qebc", "qec"])
def test_traced_collection_gives_torchrecs_traced_output(kind):
    ours, theirs = pairs(kind)
    traced_ours, traced_theirs = torch.fx.symbolic_trace(ours), torch.fx.symbolic_trace(theirs)
    assert_same(traced_ours(kjt(rtk)), traced_theirs(kjt(torchrec)))
    assert_same(traced_ours(kjt(rtk)), ours(kjt(rtk)))
    assert sorted(traced_ours.state_dict()) == sorted(k for k in theirs.state_dict() if k.endswith(".weight"))


class Tower(torch.nn.Module):
    """KJT code and a collection inside a model: what a traced TorchRec model does with them."""

    def __init__(self, ebc) -> None:
        super().__init__()
        self.ebc = ebc
        self.linear = torch.nn.Linear(20, 1)

    def forward(self, features):
        pooled = self.ebc(features)
        ids = features["f2"].values().float().sum() + features.lengths().sum()
        return self.linear(pooled.values()) + ids, pooled["f3"]


def test_traced_model_with_kjt_code_gives_torchrecs_output():
    ours, theirs = pairs("ebc")
    model_ours, model_theirs = Tower(ours), Tower(theirs)
    model_theirs.linear.load_state_dict(model_ours.linear.state_dict())
    traced_ours, traced_theirs = torch.fx.symbolic_trace(model_ours), torch.fx.symbolic_trace(model_theirs)
    for a, b, c in zip(traced_ours(kjt(rtk)), traced_theirs(kjt(torchrec)), model_ours(kjt(rtk))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
        assert torch.equal(a, c)
    (loss := traced_ours(kjt(rtk))[0].sum()).backward()  # the traced graph trains the tables like the model
    assert ours.embedding_bags["t1"].weight.grad is not None and loss.requires_grad


class Regrouper(torch.nn.Module):
    """KeyedTensor.regroup / regroup_as_dict on a collection's output, as TorchRec models do (its regroup is one
    wrapped call in the graph)."""

    def __init__(self, ebc, lib) -> None:
        super().__init__()
        self.ebc = ebc
        self.keyed_tensor = lib.KeyedTensor

    def forward(self, features):
        pooled = self.ebc(features)
        first, second = self.keyed_tensor.regroup([pooled], [["f3", "f1"], ["f2"]])
        by_name = self.keyed_tensor.regroup_as_dict([pooled], [["f2", "f3"]], ["tail"])
        return first, second, by_name["tail"]


@pytest.mark.parametrize("trace", ["torch.fx", "rectoolkit.fx"])
def test_traced_regroup_of_a_collections_output_gives_torchrecs_output(trace):
    from rectoolkit.fx import symbolic_trace

    ours, theirs = pairs("ebc")
    traced_ours = (torch.fx.symbolic_trace if trace == "torch.fx" else symbolic_trace)(Regrouper(ours, rtk))
    traced_theirs = torch.fx.symbolic_trace(Regrouper(theirs, torchrec))
    for a, b, c in zip(traced_ours(kjt(rtk)), traced_theirs(kjt(torchrec)), Regrouper(ours, rtk)(kjt(rtk))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        assert torch.equal(a, c)


class Builder(torch.nn.Module):
    """A forward that builds its jagged inputs from tensors (constructor, from_lengths_sync, concat, JaggedTensor,
    KeyedTensor.from_tensor_list) before the lookup."""

    def __init__(self, ebc, lib) -> None:
        super().__init__()
        self.ebc = ebc
        self.lib = lib

    def forward(self, values, lengths):
        lib = self.lib
        first = lib.KeyedJaggedTensor(keys=["f1", "f2"], values=values[:6], lengths=lengths[:6])
        second = lib.KeyedJaggedTensor.from_lengths_sync(["f3"], values[6:], lengths[6:])
        pooled = self.ebc(lib.KeyedJaggedTensor.concat([first, second]))
        rows = lib.JaggedTensor(values=values[:3].float(), lengths=lengths[:3]).to_padded_dense(desired_length=2)
        kt = lib.KeyedTensor.from_tensor_list(["p", "q"], [pooled.values(), rows])
        return kt.values(), kt["q"]


@pytest.mark.parametrize("trace", ["torch.fx", "rectoolkit.fx"])
def test_traced_forward_building_kjts_from_tensors_gives_torchrecs_output(trace):
    from rectoolkit.fx import symbolic_trace

    ours, theirs = pairs("ebc")
    traced_ours = (torch.fx.symbolic_trace if trace == "torch.fx" else symbolic_trace)(Builder(ours, rtk))
    traced_theirs = torch.fx.symbolic_trace(Builder(theirs, torchrec))
    inputs = kjt(rtk)
    values, lengths = inputs.values(), inputs.lengths()  # 6 ids in f1, f2; 3 in f3
    for a, b, c in zip(traced_ours(values, lengths), traced_theirs(values, lengths), Builder(ours, rtk)(values, lengths)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        assert torch.equal(a, c)
    with pytest.raises(ValueError, match="lengths"):  # the graph builds the KJT when it runs: its checks run too
        traced_ours(values[:5], lengths)
