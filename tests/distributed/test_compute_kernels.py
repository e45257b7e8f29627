"""ParameterSharding.compute_kernel is honoured: "dense" shards are plain autograd weights for the dense
optimizer, "fused"/"fused_uvm*" shards update in backward; kernels that cannot run are refused.

One process (ShardingEnv.local()): the kernel choice is per table and independent of the collectives, which
the multi-process equivalence tests cover. Expected values come from unsharded collections.
"""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import (DistributedModelParallel, ShardingEnv, load_checkpoint, save_checkpoint,
                                    shard_embedding_bag_collection)
from rectoolkit.distributed.checkpoint import CheckpointError
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from dist_dmp_workers import PATH, TinyModel
from dist_harness import make_batch
from dist_workers import bag_tables

KERNELS = {"t0": "dense", "t1": "fused", "t2": "fused_uvm_caching"}


def plan_with_kernels(kernels, sharding_type="table_wise"):
    return {t.name: ParameterSharding(sharding_type, kernels[t.name], ranks=[0],
                                      shards=[ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)])
            for t in bag_tables()}


def features():
    return {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}


@pytest.mark.parametrize("sharding_type", ["table_wise", "row_wise"])
def test_dense_kernel_gives_gradients_fused_kernels_update_in_backward(sharding_type):
    torch.manual_seed(0)
    fused_reference = rtk.EmbeddingBagCollection(bag_tables(), optimizer="adagrad", lr=0.1)
    dense_reference = rtk.EmbeddingBagCollection(bag_tables())
    dense_reference.load_state_dict(fused_reference.state_dict())
    module = rtk.EmbeddingBagCollection(bag_tables(), optimizer="adagrad", lr=0.1)
    module.load_state_dict(fused_reference.state_dict())
    before = {k: v.clone() for k, v in fused_reference.state_dict().items()}
    sharded = shard_embedding_bag_collection(module, plan_with_kernels(KERNELS, sharding_type), ShardingEnv.local())
    batch = make_batch(features(), 5, seed=3)
    for collection in (fused_reference, dense_reference, sharded):
        collection(batch).values().square().sum().backward()
    for table, _, weight, state in sharded.local_shards():
        if KERNELS[table] == "dense":
            assert torch.equal(weight.detach(), before[f"embedding_bags.{table}.weight"]), "a dense shard moved"
            torch.testing.assert_close(weight.grad, dense_reference.embedding_bags[table].weight.grad)
            assert state == {} and not hasattr(weight, "_in_backward_optimizers")
        else:
            assert weight.grad is None
            torch.testing.assert_close(weight.detach(), fused_reference.embedding_bags[table].weight.detach())
            assert set(state) == {"momentum1"}
    held = sharded.memory_bytes()
    assert held["host"] == held["weights"] + held["optimizer"] and held["device"] == 0  # CPU: all host memory
    dense_bytes = 4 * 40 * 8  # t0 holds no optimizer state: its optimizer is the user's
    assert held["optimizer"] == held["weights"] - dense_bytes


def test_dmp_gives_dense_kernel_shards_to_the_dense_optimizer():
    torch.manual_seed(0)
    reference = TinyModel(optimizer=None)  # plain gradients everywhere; optimizers applied by hand below
    model = TinyModel()
    model.load_state_dict(reference.state_dict())
    dmp = DistributedModelParallel(model, env=ShardingEnv.local(), plan=ShardingPlan({PATH: plan_with_kernels(KERNELS)}))
    dense_names = {name for name, _ in dmp.named_dense_parameters()}
    assert "sparse.ebc.embedding_bags.t0.weight" in dense_names  # TorchRec's name of the shard
    assert not any(".t1." in n or ".t2." in n for n in dense_names)
    assert sorted(dmp.fused_optimizer.params) == [f"{PATH}.embedding_bags.t1.weight", f"{PATH}.embedding_bags.t2.weight"]
    dense_opt = torch.optim.SGD(dmp.dense_parameters(), lr=0.5)
    # reference: t0 and the MLPs by the same SGD, t1 and t2 by Adagrad (torch's rule is the fused one's)
    fused_names = [f"sparse.ebc.embedding_bags.{t}.weight" for t in ("t1", "t2")]
    ref_params = dict(reference.named_parameters())
    ref_sgd = torch.optim.SGD([p for n, p in ref_params.items() if n not in fused_names], lr=0.5)
    ref_adagrad = torch.optim.Adagrad([ref_params[n] for n in fused_names], lr=0.1, eps=1e-8)
    kjt, dense_x = make_batch(features(), 4, seed=11), torch.randn(4, 3)
    dmp(dense_x, kjt).sum().backward()
    dense_opt.step()
    reference(dense_x, kjt).sum().backward()
    ref_sgd.step()
    ref_adagrad.step()
    state, expected = dmp.state_dict(), reference.state_dict()
    for key in expected:
        torch.testing.assert_close(state[key], expected[key], msg=key)
    with pytest.raises(ValueError, match=r"embedding shards of table\(s\) \['t0'\].*compute_kernel 'dense'"):
        save_checkpoint(dmp, "/nonexistent-not-written", dense_optimizer=dense_opt)


def test_kernels_that_cannot_run_are_refused():
    module = rtk.EmbeddingBagCollection(bag_tables(), optimizer="adagrad", lr=0.1)
    with pytest.raises(ValueError, match="'t1' is planned with compute_kernel 'quant'.*trains"):
        shard_embedding_bag_collection(module, plan_with_kernels({"t0": "fused", "t1": "quant", "t2": "fused"}),
                                       ShardingEnv.local())
    gpu_env = ShardingEnv(1, 0, None, local_world_size=1, device=torch.device("cuda"))  # refused before anything is allocated on it
    with pytest.raises(ValueError, match="'t2' is planned with compute_kernel 'fused_uvm' on rank 0 .*not supported"):
        shard_embedding_bag_collection(module, plan_with_kernels({"t0": "fused", "t1": "dense", "t2": "fused_uvm"}),
                                       gpu_env)


def data_parallel_t0():
    plan = plan_with_kernels({"t0": "fused", "t1": "fused", "t2": "fused"})
    t0 = plan["t0"]
    plan["t0"] = ParameterSharding("data_parallel", "dense", ranks=t0.ranks, shards=t0.shards)
    return plan


def test_data_parallel_replica_keeps_plain_gradients_under_a_fused_optimizer():
    # TorchRec 1.8's DATA_PARALLEL: the DENSE kernel whatever the fused optimizer; the replica's gradient goes to .grad
    # for the dense optimizer (tests/distributed/test_data_parallel_dense_vs_torchrec.py runs it beside TorchRec's)
    torch.manual_seed(0)
    fused_reference = rtk.EmbeddingBagCollection(bag_tables(), optimizer="adagrad", lr=0.1)
    plain_reference = rtk.EmbeddingBagCollection(bag_tables())
    module = rtk.EmbeddingBagCollection(bag_tables(), optimizer="adagrad", lr=0.1)
    for copy in (plain_reference, module):
        copy.load_state_dict(fused_reference.state_dict())
    initial = module.embedding_bags["t0"].weight.detach().clone()
    sharded = shard_embedding_bag_collection(module, data_parallel_t0(), ShardingEnv.local())
    batch = make_batch(features(), 5, seed=3)
    for collection in (fused_reference, plain_reference, sharded):
        collection(batch).values().square().sum().backward()
    assert [key for key in sharded.fused_optimizer.params] == ["embedding_bags.t1.weight", "embedding_bags.t2.weight"]
    for table, _, weight, state in sharded.local_shards():
        if table == "t0":  # the replica: untouched by the fused Adagrad, its gradient in .grad
            assert not hasattr(weight, "_in_backward_optimizers") and state == {}
            assert torch.equal(weight.detach(), initial)
            torch.testing.assert_close(weight.grad, plain_reference.embedding_bags["t0"].weight.grad)
        else:
            assert weight.grad is None and set(state) == {"momentum1"}, table
            torch.testing.assert_close(weight.detach(), fused_reference.embedding_bags[table].weight.detach())


def test_checkpoint_accepts_a_dense_optimizer_over_data_parallel_replicas(tmp_path):
    # without a fused optimizer the replica's .grad is left to the dense optimizer, whose state is the same on
    # every rank: saving it once is right
    plan = {name: ParameterSharding("data_parallel", "dense", ranks=ps.ranks, shards=ps.shards)
            for name, ps in plan_with_kernels(KERNELS).items()}
    dmp = DistributedModelParallel(TinyModel(optimizer=None), env=ShardingEnv.local(), plan=ShardingPlan({PATH: plan}))
    dense_opt = torch.optim.Adagrad(dmp.dense_parameters(), lr=0.1)
    assert any(".t0" in name for name, _ in dmp.named_dense_parameters())  # the replica is the dense optimizer's
    dmp(torch.randn(4, 3), make_batch(features(), 4, seed=5)).sum().backward()
    dense_opt.step()
    save_checkpoint(dmp, tmp_path / "ckpt", dense_optimizer=dense_opt)  # same replica on every rank: allowed
    assert len(list((tmp_path / "ckpt").glob("data-*/dense.pt"))) == 1


def test_a_replica_and_its_dense_optimizer_state_round_trip_a_checkpoint(tmp_path):
    # the replica saves its weight (no fused state: TorchRec's dense kernel), the dense optimizer its Adagrad state
    def build():
        dmp = DistributedModelParallel(TinyModel(), env=ShardingEnv.local(), plan=ShardingPlan({PATH: data_parallel_t0()}))
        return dmp, torch.optim.Adagrad(dmp.dense_parameters(), lr=0.1)

    torch.manual_seed(0)
    dmp, dense_opt = build()
    replica = dict(dmp.named_parameters())[f"{PATH}.embedding_bags.t0.weight"]
    assert any(p is replica for p in dense_opt.param_groups[0]["params"])
    dmp(torch.randn(4, 3), make_batch(features(), 4, seed=5)).sum().backward()
    dense_opt.step()
    save_checkpoint(dmp, tmp_path / "ckpt", dense_optimizer=dense_opt)
    torch.manual_seed(1)
    other, other_opt = build()
    load_checkpoint(other, tmp_path / "ckpt", dense_optimizer=other_opt)
    other_replica = dict(other.named_parameters())[f"{PATH}.embedding_bags.t0.weight"]
    assert torch.equal(other_replica, replica)
    assert torch.equal(other_opt.state[other_replica]["sum"], dense_opt.state[replica]["sum"])
    assert other_opt.state[other_replica]["sum"].abs().sum() > 0
    # a fused table needs the state the replica never had: refused, naming the table and the way out
    fused = DistributedModelParallel(TinyModel(), env=ShardingEnv.local(), plan=ShardingPlan({PATH: plan_with_kernels(
        {"t0": "fused", "t1": "fused", "t2": "fused"})}))
    with pytest.raises(CheckpointError, match="'sparse.ebc.t0' has no optimizer state 'momentum1' .*a DATA_PARALLEL replica"):
        load_checkpoint(fused, tmp_path / "ckpt")
