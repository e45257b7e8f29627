"""The keyed optimizers' smaller API beside TorchRec 1.8's: `zero_grad()` drops the gradients (TorchRec's wrapper
calls torch's zero_grad(), whose default sets them to None), `set_optimizer_step` / `update_hyper_parameters` are forwarded by
CombinedOptimizer, KeyedOptimizerWrapper and OptimizerWrapper to the optimizers that have them (skipping torch's
own, as TorchRec's do); a sharded collection's fused optimizer honours them: the step count feeds the next fused Adam
update (checked against Adam's formula), "lr" is set, other hyper-parameters are refused by name.
"""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv
from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
from rectoolkit.distributed.sharding_plan import construct_module_sharding_plan, table_wise


class Stepped(torch.optim.SGD):
    """An optimizer with TorchRec's two optional methods, recording their calls."""

    calls: list

    def set_optimizer_step(self, step):
        self.calls.append(("step", step))

    def update_hyper_parameters(self, params):
        self.calls.append(("hyper", params))


def _calls(keyed) -> list:
    """What a CombinedOptimizer over an OptimizerWrapper over a KeyedOptimizerWrapper (and a torch SGD without the
    methods) passes on, and the gradients zero_grad() leaves."""
    weight, other = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    Stepped.calls = []
    inner = keyed.KeyedOptimizerWrapper({"w": weight}, lambda params: Stepped(params, lr=0.1))
    plain = keyed.KeyedOptimizerWrapper({"o": other}, lambda params: torch.optim.SGD(params, lr=0.1))
    combined = keyed.CombinedOptimizer([("a", keyed.OptimizerWrapper(inner)), ("b", plain)])
    (weight.sum() + other.sum()).backward()
    combined.zero_grad()
    grads = [None if p.grad is None else p.grad.tolist() for p in (weight, other)]
    combined.set_optimizer_step(7)
    combined.update_hyper_parameters({"lr": 0.5})
    return [grads, Stepped.calls]


def test_zero_grad_and_forwarding_are_torchrecs():
    torchrec_keyed = pytest.importorskip("torchrec.optim.keyed")
    from rectoolkit.optim import keyed

    assert _calls(keyed) == _calls(torchrec_keyed)
    assert _calls(keyed) == [[None, None], [("step", 7), ("hyper", {"lr": 0.5})]]


def _sharded(optimizer: str = "adam", lr: float = 0.1):
    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t0", num_embeddings=4, embedding_dim=2,
                                                             feature_names=["f0"])])
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer, "learning_rate": lr})
    plan = construct_module_sharding_plan(ebc, {"t0": table_wise(rank=0, compute_kernel="fused")}, world_size=1,
                                          device_type="cpu", sharder=sharder)
    return sharder.shard(ebc, plan, ShardingEnv.local())


def _adam_row(weight, grad, step, lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8):
    """One Adam update of a row from zero state at step `step` (the formula, not the kernel)."""
    m_hat = (1 - beta1) * grad / (1 - beta1 ** step)
    v_hat = (1 - beta2) * grad * grad / (1 - beta2 ** step)
    return weight - lr * m_hat / (v_hat.sqrt() + eps)


def test_a_set_step_feeds_the_next_fused_adam_update():
    sharded = _sharded("adam")
    weight = dict(sharded.fused_optimizer.params)["embedding_bags.t0.weight"]
    before = weight.detach().clone()
    sharded.fused_optimizer.set_optimizer_step(99)  # the next update is step 100
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    grad = torch.tensor([1.0, -2.0])
    (sharded(kjt).wait().values() * grad).sum().backward()
    expected = _adam_row(before[1], grad, step=100)
    torch.testing.assert_close(weight.detach()[1], expected)
    assert not torch.allclose(expected, _adam_row(before[1], grad, step=1))  # the step count matters here


def test_fused_update_hyper_parameters_sets_lr_and_refuses_the_rest():
    optimizer = _sharded("sgd").fused_optimizer
    optimizer.update_hyper_parameters({"lr": 0.25})
    assert [group["lr"] for group in optimizer.param_groups] == [0.25]
    with pytest.raises(NotImplementedError, match=r"\['eps'\] cannot be changed after sharding"):
        optimizer.update_hyper_parameters({"eps": 0.1, "lr": 0.3})


def test_an_unsharded_collections_fused_optimizer_takes_them_too():
    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t0", num_embeddings=4, embedding_dim=2,
                                                             feature_names=["f0"])], optimizer="adam", lr=0.1)
    before = ebc.embedding_bags["t0"].weight.detach().clone()
    ebc.fused_optimizer.set_optimizer_step(99)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f0"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    grad = torch.tensor([1.0, -2.0])
    (ebc(kjt).values() * grad).sum().backward()
    torch.testing.assert_close(ebc.embedding_bags["t0"].weight.detach()[1], _adam_row(before[1], grad, step=100))
    ebc.fused_optimizer.update_hyper_parameters({"lr": 0.5})
    assert ebc.fused_optimizer.param_groups[0]["lr"] == 0.5
    with pytest.raises(NotImplementedError, match=r"\['beta1'\] cannot be changed"):
        ebc.fused_optimizer.update_hyper_parameters({"beta1": 0.5})


def _sparse_adam_state(keyed) -> list:
    """init_state with the parameter named sparse: torch's SparseAdam takes only sparse gradients."""
    weight = torch.nn.Parameter(torch.ones(3, 2))
    optimizer = keyed.CombinedOptimizer([("emb", keyed.KeyedOptimizerWrapper(
        {"w": weight}, lambda params: torch.optim.SparseAdam(params, lr=0.1)))])
    optimizer.init_state({"emb.w"})
    return [sorted(state) for state in optimizer.state_dict()["state"].values()] + [weight.tolist()]


def test_init_state_gives_the_named_parameters_sparse_gradients():
    torchrec_keyed = pytest.importorskip("torchrec.optim.keyed")
    from rectoolkit.optim import keyed

    assert _sparse_adam_state(keyed) == _sparse_adam_state(torchrec_keyed)
    assert _sparse_adam_state(keyed)[0] == ["exp_avg", "exp_avg_sq", "step"]
    with pytest.warns(UserWarning, match=r"\['w'\] name no parameter of this optimizer"):
        keyed.CombinedOptimizer([("emb", keyed.KeyedOptimizerWrapper(
            {"w": torch.nn.Parameter(torch.ones(2))}, lambda params: torch.optim.SGD(params, lr=0.1)))]).init_state({"w"})
