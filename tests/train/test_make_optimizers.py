"""The recipe's optimizers for a DistributedModelParallel: a DATA_PARALLEL replica has the dense kernel (as in
TorchRec 1.8, its averaged gradient waits in .grad), so the recipe gives it the torch Adagrad at embedding_lr, as it
gives unfused tables; the fused tables stay with the fused optimizer, the MLPs with Adam."""

from __future__ import annotations

import torch

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
from rectoolkit.distributed import sharding_plan as sp
from rectoolkit.plan.types import ShardingPlan
from rectoolkit.train.loop import AllOptimizers, TrainConfig, build_model, make_optimizers

PATH = "sparse_arch.embedding_bag_collection"


def test_a_data_parallel_replica_is_trained_by_the_recipes_adagrad():
    config = TrainConfig(embedding_lr=0.5)
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=10, embedding_dim=4, feature_names=[f"f{i}"])
              for i in range(2)]
    model = build_model(config, tables, 3, True, torch.device("cpu"))
    ebc = model.sparse_arch.embedding_bag_collection
    initial = ebc.embedding_bags["t0"].weight.detach().clone()
    plan = ShardingPlan({PATH: sp.construct_module_sharding_plan(
        ebc, {"t0": sp.data_parallel(), "t1": sp.table_wise(rank=0)}, world_size=1, device_type="cpu")})
    dmp = DistributedModelParallel(model, env=ShardingEnv.local(), plan=plan)
    optimizers = make_optimizers(dmp, config)
    replica = dict(dmp.named_parameters())[f"{PATH}.embedding_bags.t0.weight"]
    adam, fused, adagrad = optimizers
    assert isinstance(adam, torch.optim.Adam) and all(p is not replica for p in adam.param_groups[0]["params"])
    assert list(fused.params) == [f"{PATH}.embedding_bags.t1.weight"]
    assert isinstance(adagrad, torch.optim.Adagrad) and adagrad.param_groups[0]["lr"] == 0.5
    assert [p for p in adagrad.param_groups[0]["params"]] == [replica]
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], torch.tensor([1, 2, 3, 4]), torch.tensor([1, 1, 1, 1]))
    step = AllOptimizers(optimizers)
    step.zero_grad()
    dmp(torch.randn(2, 3), kjt).sum().backward()
    gradient = replica.grad.clone()
    step.step()
    # torch's Adagrad rule on a first step, by hand: w - lr * g / (|g| + eps) where g != 0
    expected = initial - 0.5 * gradient / (gradient.abs() + 1e-10)
    torch.testing.assert_close(replica.detach(), expected)
    assert gradient[1:3].abs().sum() > 0
