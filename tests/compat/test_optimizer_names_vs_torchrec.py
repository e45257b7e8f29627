"""torchrec.optim's optimizer classes against TorchRec 1.8: RowWiseAdagrad (a real optimizer: same weights and
state step by step, and, given to apply_optimizer_in_backward before sharding, the fused row-wise Adagrad of the
shards gives what TorchRec's dense RowWiseAdagrad gives on the unsharded collection); SGD, Adagrad, Adam, LAMB,
LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB (names of fused optimizers: the same fused optimizer as TorchRec
maps them to, or a clear refusal for those rectoolkit does not fuse; step() raises as TorchRec's)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
import rectoolkit.optim as ours
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig

torchrec_optim = pytest.importorskip("torchrec.optim", reason="differential tests need TorchRec 1.8")
pytestmark = pytest.mark.torchrec

NAMES = ["SGD", "Adagrad", "Adam", "RowWiseAdagrad", "LAMB", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB"]
FUSED = {"EXACT_SGD": "sgd", "EXACT_ADAGRAD": "adagrad", "ADAM": "adam", "EXACT_ROWWISE_ADAGRAD": "row_wise_adagrad"}


def _weights(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, generator=g), torch.randn(4, 6, generator=g)]


@pytest.mark.parametrize("options", [
    {},
    {"lr": 0.3, "eps": 1e-6},
    {"lr": 0.2, "lr_decay": 0.1, "weight_decay": 0.05, "initial_accumulator_value": 0.5},
    {"lr": 0.1, "maximize": True},
])
def test_row_wise_adagrad_steps_as_torchrecs(options):
    params = {lib: [torch.nn.Parameter(w.clone()) for w in _weights(0)] for lib in ("ours", "torchrec")}
    optimizers = {"ours": ours.RowWiseAdagrad(params["ours"], **options),
                  "torchrec": torchrec_optim.RowWiseAdagrad(params["torchrec"], **options)}
    for step in range(4):
        for lib, optimizer in optimizers.items():
            for param, grad in zip(params[lib], _weights(10 + step)):
                param.grad = grad.clone()
                if step == 2:
                    param.grad[1] = 0.0  # a row without a gradient this step
            optimizer.step()
        for mine, theirs in zip(params["ours"], params["torchrec"]):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-7)
    for mine, theirs in zip(params["ours"], params["torchrec"]):
        a, b = optimizers["ours"].state[mine], optimizers["torchrec"].state[theirs]
        assert sorted(a) == sorted(b) == ["step", "sum"] and a["sum"].shape == b["sum"].shape
        torch.testing.assert_close(a["sum"], b["sum"], rtol=0, atol=1e-7)
        assert float(a["step"]) == float(b["step"]) == 4.0


def test_row_wise_adagrad_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match=r"parameter 1 of group 0 has shape \(4,\).*torch.optim.Adagrad"):
        ours.RowWiseAdagrad([torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(TypeError, match=r"unsupported argument\(s\) \['momentum'\]"):
        ours.RowWiseAdagrad([torch.nn.Parameter(torch.zeros(2, 2))], momentum=0.9)  # TorchRec's drops it unread
    with pytest.raises(ValueError, match="lr must be >= 0, got -1"):
        ours.RowWiseAdagrad([torch.nn.Parameter(torch.zeros(2, 2))], lr=-1)


@pytest.mark.parametrize("name", NAMES)
def test_each_name_fuses_what_torchrec_maps_it_to_or_is_refused(name):
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    theirs = optimizer_type_to_emb_opt_type(getattr(torchrec_optim, name)).name
    if theirs in FUSED:
        mine = FusedOptimizerConfig.from_torch_optimizer(getattr(ours, name), {"lr": 0.1})
        assert mine.optimizer.value == FUSED[theirs] and mine.lr == 0.1
    else:
        with pytest.raises(ValueError, match=f"cannot fuse {name} .*SGD, Adagrad, Adam.*RowWiseAdagrad"):
            FusedOptimizerConfig.from_torch_optimizer(getattr(ours, name), {"lr": 0.1})
    if name != "RowWiseAdagrad":  # the names do not run by themselves, in either library
        for lib in (ours, torchrec_optim):
            with pytest.raises(NotImplementedError):
                getattr(lib, name)([torch.nn.Parameter(torch.zeros(2, 2))], lr=0.1).step()


def test_apply_optimizer_in_backward_with_row_wise_adagrad_fuses_it_into_the_shards():
    """TorchRec code: apply_optimizer_in_backward(RowWiseAdagrad, ...) then DMP. The shards' fused row-wise Adagrad
    (touched rows only) gives, step after step, what TorchRec's dense RowWiseAdagrad gives on the unsharded
    collection (rows without a gradient do not move there either)."""
    import torchrec

    configs = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=12, embedding_dim=4, feature_names=["f0"]),
               rtk.EmbeddingBagConfig(name="t1", num_embeddings=9, embedding_dim=8, feature_names=["f1"])]
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(configs)
    reference = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name=c.name, num_embeddings=c.num_embeddings, embedding_dim=c.embedding_dim, feature_names=c.feature_names)
        for c in configs])
    reference.load_state_dict(ebc.state_dict())
    initial = {name: m.weight.detach().clone() for name, m in ebc.embedding_bags.items()}
    reference_optimizer = torchrec_optim.RowWiseAdagrad(reference.parameters(), lr=0.1, eps=1e-8)
    ours.apply_optimizer_in_backward(ours.RowWiseAdagrad, ebc.parameters(), {"lr": 0.1, "eps": 1e-8})
    plan = {c.name: rtk.ParameterSharding("row_wise", ranks=[0], shards=[
        rtk.ShardMetadata.on_rank(0, 0, 0, c.num_embeddings, c.embedding_dim)]) for c in configs}
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"": plan}))
    assert dmp.module.fused_optimizer_config == FusedOptimizerConfig("row_wise_adagrad", lr=0.1, eps=1e-8)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        lengths = torch.randint(0, 4, (6,), generator=g)
        values = torch.cat([torch.randint(0, c.num_embeddings, (int(n),), generator=g)
                            for c, n in zip(configs, lengths.view(2, 3).sum(1))])
        grad_out = torch.randn(3, 12, generator=g)
        kjt = dict(keys=["f0", "f1"], values=values, lengths=lengths)
        (dmp(rtk.KeyedJaggedTensor.from_lengths_sync(**kjt)).values() * grad_out).sum().backward()
        reference_optimizer.zero_grad()
        (reference(torchrec.KeyedJaggedTensor.from_lengths_sync(**kjt)).values() * grad_out).sum().backward()
        reference_optimizer.step()
    for table, _, weight, _ in dmp.module.local_shards():
        torch.testing.assert_close(weight.detach(), reference.embedding_bags[table].weight.detach(), rtol=1e-5,
                                   atol=1e-6)
        moved = (weight.detach() - initial[table]).abs().amax(1) > 1e-3
        assert 0 < int(moved.sum()) < len(moved), f"{table}: some rows, not all, are trained ({moved.tolist()})"
