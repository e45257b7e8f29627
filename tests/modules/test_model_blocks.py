"""MLP, the cross networks and the DeepFM blocks: hand-worked cases, clear errors, docstrings, and TorchRec 1.8
with the same weights (outputs and state_dict keys equal)."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torch

from rectoolkit.modules.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from rectoolkit.modules.deepfm import DeepFM, FactorizationMachine
from rectoolkit.modules.mlp import MLP, Perceptron


@pytest.mark.parametrize("name", ["rectoolkit.modules.mlp", "rectoolkit.modules.activation",
                                  "rectoolkit.modules.crossnet", "rectoolkit.modules.deepfm"])
def test_docstring_examples(name):
    assert doctest.testmod(importlib.import_module(name)).failed == 0


def test_crossnet_one_layer_by_hand():
    net = CrossNet(in_features=2, num_layers=1)
    with torch.no_grad():
        net.kernels[0].copy_(torch.tensor([[1.0, 2.0], [0.0, 1.0]]))
        net.bias[0].copy_(torch.tensor([[0.5], [-1.0]]))
    x = torch.tensor([[1.0, 3.0]])
    # W x = [1 + 6, 3] = [7, 3]; x * (W x + b) + x = [1 * 7.5, 3 * 2] + [1, 3]
    torch.testing.assert_close(net(x), torch.tensor([[8.5, 9.0]]))


def test_low_rank_crossnet_one_layer_by_hand():
    net = LowRankCrossNet(in_features=2, num_layers=1, low_rank=1)
    with torch.no_grad():
        net.V_kernels[0].copy_(torch.tensor([[1.0, 1.0]]))   # V x = 4
        net.W_kernels[0].copy_(torch.tensor([[2.0], [0.5]]))  # W (V x) = [8, 2]
        net.bias[0].copy_(torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(net(torch.tensor([[1.0, 3.0]])), torch.tensor([[1.0 * 9 + 1, 3.0 * 2 + 3]]))


def test_vector_crossnet_one_layer_by_hand():
    net = VectorCrossNet(in_features=2, num_layers=1)
    with torch.no_grad():
        net.kernels[0].copy_(torch.tensor([[1.0], [2.0]]))  # x . w = 7
        net.bias[0].copy_(torch.tensor([[1.0], [0.0]]))
    torch.testing.assert_close(net(torch.tensor([[1.0, 3.0]])), torch.tensor([[7.0 + 1 + 1, 21.0 + 0 + 3]]))


def test_factorization_machine_is_the_sum_of_pairwise_products():
    torch.manual_seed(0)
    embeddings = [torch.randn(3, 2, 2), torch.randn(3, 3)]
    flat = torch.cat([embeddings[0].flatten(1), embeddings[1]], dim=1)
    expected = torch.stack([sum(row[i] * row[j] for i in range(7) for j in range(i + 1, 7)) for row in flat])
    torch.testing.assert_close(FactorizationMachine()(embeddings), expected.unsqueeze(1))


def test_mlp_relu_and_activation_on_last():
    mlp = MLP(2, [2, 1], activation="relu", activation_on_last=False)
    with torch.no_grad():
        mlp._mlp[0]._linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        mlp._mlp[0]._linear.bias.zero_()
        mlp._mlp[1]._linear.weight.copy_(torch.tensor([[-1.0, -1.0]]))
        mlp._mlp[1]._linear.bias.zero_()
    # hidden relu([2, -3]) = [2, 0]; last layer -2 with no relu
    torch.testing.assert_close(mlp(torch.tensor([[2.0, 3.0]])), torch.tensor([[-2.0]]))


def test_mlp_activation_factory_gives_each_layer_its_own_module_and_instance_is_shared():
    per_layer = MLP(3, [4, 4], activation=torch.nn.PReLU)
    assert per_layer._mlp[0]._activation_fn is not per_layer._mlp[1]._activation_fn
    shared = torch.nn.PReLU()
    together = MLP(3, [4, 4], activation=shared)
    assert together._mlp[0]._activation_fn is together._mlp[1]._activation_fn is shared


def test_bad_inputs_name_the_numbers():
    with pytest.raises(ValueError, match=r"shape \[4, 7\] but in_features=8"):
        CrossNet(8, 2)(torch.randn(4, 7))
    with pytest.raises(ValueError, match="low_rank=0"):
        LowRankCrossNet(8, 2, low_rank=0)
    with pytest.raises(ValueError, match="num_experts=0"):
        LowRankMixtureCrossNet(8, 2, num_experts=0)
    with pytest.raises(ValueError, match=r"shape \[2, 5\] but in_size=6"):
        Perceptron(6, 3)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="'tanh' is not one of"):
        MLP(3, [4], activation="tanh")
    with pytest.raises(ValueError, match=r"first dimensions \[2, 3\] differ"):
        FactorizationMachine()([torch.randn(2, 4), torch.randn(3, 4)])
    with pytest.raises(ValueError, match="empty list"):
        DeepFM(torch.nn.Identity())([])


# --- TorchRec 1.8 with the same weights --------------------------------------------------------------------

def _same_weights_same_outputs(ours, theirs, *inputs):
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    torch.testing.assert_close(ours(*inputs), theirs(*inputs))


@pytest.mark.torchrec
@pytest.mark.parametrize("name,args", [("CrossNet", (12, 3)), ("LowRankCrossNet", (12, 3, 2)),
                                       ("VectorCrossNet", (12, 3)), ("LowRankMixtureCrossNet", (12, 2, 1, 3)),
                                       ("LowRankMixtureCrossNet", (12, 2, 3, 2))])
def test_crossnets_match_torchrec(name, args):
    crossnet = pytest.importorskip("torchrec.modules.crossnet")
    ours_module = importlib.import_module("rectoolkit.modules.crossnet")
    torch.manual_seed(1)
    ours = getattr(ours_module, name)(*args)
    with torch.no_grad():  # TorchRec zeroes the biases: make them matter
        for bias in ours.bias:
            bias.normal_()
    _same_weights_same_outputs(ours, getattr(crossnet, name)(*args), torch.randn(5, 12))


@pytest.mark.torchrec
@pytest.mark.parametrize("activation", ["relu", "sigmoid", "swish_layernorm", "default", "factory"])
@pytest.mark.parametrize("activation_on_last", [True, False])
def test_mlp_matches_torchrec(activation, activation_on_last):
    torchrec_mlp = pytest.importorskip("torchrec.modules.mlp")
    kwargs = {"relu": dict(activation="relu"), "sigmoid": dict(activation="sigmoid"),
              "swish_layernorm": dict(activation="swish_layernorm"), "default": {},
              "factory": dict(activation=torch.nn.PReLU)}[activation]
    torch.manual_seed(2)
    ours = MLP(6, [5, 3], activation_on_last=activation_on_last, **kwargs)
    with torch.no_grad():  # non-trivial layer-norm and PReLU parameters
        for name, parameter in ours.named_parameters():
            if "_activation_fn" in name:
                parameter.uniform_(0.5, 1.5)
    _same_weights_same_outputs(ours, torchrec_mlp.MLP(6, [5, 3], activation_on_last=activation_on_last, **kwargs),
                               torch.randn(4, 6))


@pytest.mark.torchrec
def test_deepfm_blocks_match_torchrec():
    deepfm = pytest.importorskip("torchrec.modules.deepfm")
    torch.manual_seed(3)
    embeddings = [torch.randn(4, 2, 3), torch.randn(4, 5)]
    ours = DeepFM(torch.nn.Sequential(torch.nn.Linear(11, 4), torch.nn.ReLU()))
    _same_weights_same_outputs(ours, deepfm.DeepFM(torch.nn.Sequential(torch.nn.Linear(11, 4), torch.nn.ReLU())),
                               embeddings)
    _same_weights_same_outputs(FactorizationMachine(), deepfm.FactorizationMachine(), embeddings)
