"""`rtk.launch` on a GPU machine: NCCL and cuda:<local rank> by default, and the memory a worker measures
(`torch.cuda.max_memory_allocated`) beside the planner's estimate, for a DMP worker and for the recipe."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from gpu_helpers import dry_run
from rectoolkit.train import TrainConfig, train

pytestmark = pytest.mark.gpu

TABLES = [rtk.EmbeddingBagConfig(name="user", num_embeddings=5000, embedding_dim=16, feature_names=["user_id"]),
          rtk.EmbeddingBagConfig(name="item", num_embeddings=3000, embedding_dim=16, feature_names=["item_id"])]


def test_default_backend_is_nccl_while_there_is_a_gpu_per_rank():
    if dry_run():
        assert rtk.launch.default_backend(1) == "gloo"
        return
    count = torch.cuda.device_count()
    assert rtk.launch.default_backend(1) == "nccl" and rtk.launch.default_backend(count) == "nccl"
    assert rtk.launch.default_backend(count + 1) == "gloo"  # more ranks than GPUs: gloo on the CPU


def _where_am_i(ctx):
    tensor = torch.ones(2, device=ctx.device)
    if ctx.world_size > 1 or torch.distributed.is_initialized():
        torch.distributed.all_reduce(tensor)  # a real collective on the chosen backend
    return {"backend": ctx.backend, "device": str(ctx.device), "sum": tensor.tolist(),
            "current": torch.cuda.current_device() if ctx.device.type == "cuda" else None}


@pytest.mark.timeout(300)
def test_launch_picks_nccl_and_the_local_gpu():
    results = rtk.launch(_where_am_i, 1, echo_output=False, timeout_s=240)
    expected = {"backend": "gloo", "device": "cpu", "current": None} if dry_run() else \
        {"backend": "nccl", "device": "cuda:0", "current": 0}
    assert {k: results[0][k] for k in expected} == expected
    assert results[0]["sum"] == [1.0, 1.0]


def _planned_dmp_worker(ctx, steps):
    from rectoolkit.distributed import DistributedModelParallel
    from rectoolkit.planner import EmbeddingShardingPlanner, Topology

    planner = EmbeddingShardingPlanner(Topology(world_size=ctx.world_size, compute_device=ctx.device.type,
                                                batch_size=64), optimizer="adagrad")
    plan = planner.plan(rtk.EmbeddingBagCollection(TABLES, device="meta", optimizer="adagrad", lr=0.1))
    report = planner.report()
    estimate = int((report.memory["weights"] + report.memory["optimizer"]).to_numpy()[ctx.rank])
    model = DistributedModelParallel(rtk.EmbeddingBagCollection(TABLES, device="meta", optimizer="adagrad", lr=0.1),
                                     plan=plan, device=ctx.device)
    g = torch.Generator().manual_seed(ctx.rank)
    for step in range(steps):
        kjt = rtk.KeyedJaggedTensor.from_lengths_sync(
            ["user_id", "item_id"], torch.randint(0, 3000, (128,), generator=g), torch.ones(128, dtype=torch.int64))
        model(kjt.to(ctx.device)).values().sum().backward()
        usage = model.memory_usage()
        ctx.report(step=step + 1, **{f"memory_{k}": v for k, v in usage.items()})
    return {"estimate": estimate, **usage}


@pytest.mark.timeout(300)
def test_measured_memory_beside_the_planners_estimate():
    reports = []
    results = rtk.launch(_planned_dmp_worker, 1, 3, on_metrics=reports.append, echo_output=False, timeout_s=240)
    usage = results[0]
    held = usage["embedding_weights"] + usage["embedding_optimizer"]
    assert held == usage["estimate"] == 2 * 4 * (5000 + 3000) * 16  # weights + Adagrad state, fp32, hand-counted
    assert [r["step"] for r in reports] == [1, 2, 3]
    if not dry_run():
        assert usage["embedding_device"] == held and usage["embedding_host"] == 0
        # the allocator's peak holds the shards and their state, plus the batch's activations (not more than
        # a few MiB here)
        assert held <= usage["cuda_max_allocated"] < held + 64 * 2**20, usage
        assert reports[-1]["memory_cuda_max_allocated"] == usage["cuda_max_allocated"]


@pytest.mark.timeout(300)
def test_the_training_recipe_reports_cuda_peak_memory():
    reports = []
    config = TrainConfig(workload="dlrm26", max_rows=1000, embedding_dim=8, batch_size=64, steps=3, report_every=1)
    summaries = rtk.launch(train, 1, config, on_metrics=reports.append, echo_output=False, timeout_s=240)
    assert summaries[0]["steps"] == 3 and [r["step"] for r in reports] == [1, 2, 3]
    if not dry_run():
        peak = reports[-1]["memory_cuda_max_allocated_bytes"]
        assert peak >= reports[-1]["param_bytes"] > 0, reports[-1]
