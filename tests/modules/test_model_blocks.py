"""MLP, the cross networks and the DeepFM blocks: hand-worked cases, clear errors, docstrings, and TorchRec 1.8
with the same weights (outputs and state_dict keys equal)."""

from __future__ import annotations

import doctest
import importlib
import warnings

import pytest
import torch

from rectoolkit.modules.crossnet import CrossNet, LowRankCrossNet, LowRankMixtureCrossNet, VectorCrossNet
from rectoolkit.modules.deepfm import DeepFM, FactorizationMachine
from rectoolkit.modules.mlp import MLP, Perceptron


@pytest.mark.parametrize("name", ["rectoolkit.modules.mlp", "rectoolkit.modules.activation",
                                  "rectoolkit.modules.crossnet", "rectoolkit.modules.deepfm",
                                  "rectoolkit.modules.mixed_dtypes", "rectoolkit.modules.layout"])
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


@pytest.mark.torchrec
@pytest.mark.parametrize("shape", [(2, 3, 12), (12,), (1, 12)])
def test_low_rank_crossnet_takes_any_leading_dimensions_as_torchrec(shape):
    crossnet = pytest.importorskip("torchrec.modules.crossnet")
    torch.manual_seed(4)
    ours = LowRankCrossNet(12, 2, low_rank=3)
    with torch.no_grad():
        for bias in ours.bias:
            bias.normal_()
    _same_weights_same_outputs(ours, crossnet.LowRankCrossNet(12, 2, low_rank=3), torch.randn(*shape))
    with pytest.raises(ValueError, match=r"shape \[2, 3, 11\] but in_features=12; pass a \[\.\.\., 12\] tensor"):
        ours(torch.randn(2, 3, 11))


@pytest.mark.torchrec
def test_mlp_without_layers_is_the_identity_as_torchrec():
    torchrec_mlp = pytest.importorskip("torchrec.modules.mlp")
    x = torch.randn(3, 5)
    assert torch.equal(MLP(5, []).forward(x), torchrec_mlp.MLP(5, [])(x))
    assert list(MLP(5, []).state_dict()) == list(torchrec_mlp.MLP(5, []).state_dict()) == []
    with pytest.raises(ValueError, match=r"layer_sizes=\[4, 0\] must all be positive"):
        MLP(5, [4, 0])


@pytest.mark.torchrec
def test_swish_layernorm_mlp_honours_dtype():
    torchrec_mlp = pytest.importorskip("torchrec.modules.mlp")
    torch.manual_seed(5)
    ours = MLP(6, [5, 3], activation="swish_layernorm", dtype=torch.float64)
    assert {parameter.dtype for parameter in ours.parameters()} == {torch.float64}
    # TorchRec 1.8 builds this MLP in float32 whatever dtype says: its float64 copy is the reference
    reference = torchrec_mlp.MLP(6, [5, 3], activation="swish_layernorm").double()
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.uniform_(-1.0, 1.0)
    _same_weights_same_outputs(ours, reference, torch.randn(4, 6, dtype=torch.float64))


class _CalledWithAList(torch.nn.Module):
    """Calls a block on [x, x] built inside the traced code, as models call DeepFM's blocks."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block([x, x])


FX_BLOCKS = {"CrossNet": ("crossnet", (6, 2)), "LowRankCrossNet": ("crossnet", (6, 2, 2)),
             "VectorCrossNet": ("crossnet", (6, 2)), "LowRankMixtureCrossNet": ("crossnet", (6, 2, 2, 2)),
             "MLP": ("mlp", (6, [5, 3])), "Perceptron": ("mlp", (6, 3)), "DeepFM": ("deepfm", ()),
             "FactorizationMachine": ("deepfm", ())}


@pytest.mark.torchrec
@pytest.mark.parametrize("name", sorted(FX_BLOCKS))
def test_torch_fx_traces_the_blocks_as_torchrecs(name):
    import torch.fx

    pytest.importorskip("torchrec")
    module_name, args = FX_BLOCKS[name]

    def build(package):
        torch.manual_seed(6)
        cls = getattr(importlib.import_module(f"{package}.modules.{module_name}"), name)
        block = cls(torch.nn.Linear(12, 2)) if name == "DeepFM" else cls(*args)
        return _CalledWithAList(block) if module_name == "deepfm" else block

    ours, theirs = build("rectoolkit"), build("torchrec")
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(4, 6)
    torch.testing.assert_close(torch.fx.symbolic_trace(ours)(x), torch.fx.symbolic_trace(theirs)(x))
    torch.testing.assert_close(ours(x), theirs(x))


@pytest.mark.parametrize("name", ["perceptron", "mlp", "mlp_swish_layernorm", "factorization_machine", "deepfm"])
def test_torch_jit_script_compiles_the_blocks_that_torchrecs_does(name):
    """TorchRec's Perceptron, MLP, FactorizationMachine and DeepFM script (legacy TorchScript serving); so do these,
    giving eager's output (the input checks are left out of the scripted program)."""
    torch.manual_seed(0)
    block, inputs = {
        "perceptron": (Perceptron(5, 4), (torch.randn(3, 5),)),
        "mlp": (MLP(5, [4, 2]), (torch.randn(3, 5),)),
        "mlp_swish_layernorm": (MLP(5, [4, 2], activation="swish_layernorm"), (torch.randn(3, 5),)),
        "factorization_machine": (FactorizationMachine(), ([torch.randn(3, 2, 4), torch.randn(3, 3)],)),
        "deepfm": (DeepFM(torch.nn.Linear(11, 2)), ([torch.randn(3, 2, 4), torch.randn(3, 3)],)),
    }[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript
        scripted = torch.jit.script(block)
    torch.testing.assert_close(scripted(*inputs), block(*inputs))
    with pytest.raises(ValueError, match="first dimensions|in_size=5"):  # eager still checks its input
        block(*([torch.randn(3, 4), torch.randn(2, 3)],) if "mlp" not in name and name != "perceptron"
              else (torch.randn(3, 4),))
