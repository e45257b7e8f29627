"""Workers of the distributed gpu tests (importable by spawned processes): DistributedModelParallel with its
shards and dense part on a CUDA device, against the unsharded model on the CPU."""

from __future__ import annotations

import json

import torch

from rectoolkit.distributed import DistributedModelParallel
from rectoolkit.optim import CombinedOptimizer
from rectoolkit.plan.types import ShardingPlan
from dist_dmp_workers import PATH, TinyModel, expected_memory, step_batches
from dist_harness import global_batch
from dist_workers import BATCH, bag_tables, plan_for


def dmp_device_worker(rank: int, W: int, device_template: str, result_file: str) -> None:
    """Two training steps of DMP on `device` under plans that together use all six sharding types; outputs
    and final state equal the unsharded CPU model's; memory as planned, and the CUDA allocator's peak."""
    device = torch.device(device_template.format(rank=rank))
    results = []
    for case in ("mixed_a", "mixed_b"):  # row-wise, data-parallel, column-wise; table-row-wise, table-wise, grid
        lr = 0.1
        torch.manual_seed(0)
        reference = TinyModel()
        torch.manual_seed(0)
        plan = plan_for(case, bag_tables(), W, W)
        dmp = DistributedModelParallel(TinyModel(), plan=ShardingPlan({PATH: plan}), device=device)
        assert dmp.env.device == device and all(p.device == device for p in dmp.parameters()), \
            f"rank {rank}: parameters on {sorted({str(p.device) for p in dmp.parameters()})}, expected {device}"
        optimizer = CombinedOptimizer([("fused", dmp.fused_optimizer),
                                       ("dense", torch.optim.SGD(dmp.dense_parameters(), lr=lr))])
        ref_opt = torch.optim.SGD([p for n, p in reference.named_parameters() if not n.startswith("sparse.")],
                                  lr=lr / W)  # DDP averages dense gradients; the reference sums the losses
        for step in range(2):
            kjts, dense = step_batches(step, W)
            out = dmp(dense[rank].to(device), kjts[rank].to(device))
            assert out.device == device, f"rank {rank}: output on {out.device}"
            ref_out = reference(torch.cat(dense), global_batch(kjts))
            mine = ref_out[rank * BATCH:(rank + 1) * BATCH]
            assert torch.allclose(out.cpu(), mine, atol=1e-5), \
                f"rank {rank}, {case}, step {step}: outputs differ by {(out.cpu() - mine).abs().max()}"
            (out.square().sum() * 0.01).backward()
            (ref_out.square().sum() * 0.01).backward()
            optimizer.step()
            optimizer.zero_grad()
            ref_opt.step()
            ref_opt.zero_grad()
        state = dmp.state_dict()  # gathered from the shards: a collective
        for key, value in reference.state_dict().items():
            assert torch.allclose(state[key].cpu(), value, atol=1e-5), \
                f"rank {rank}, {case}: {key} differs by {(state[key].cpu() - value).abs().max()}"
        usage = dmp.memory_usage()
        assert usage["embedding_weights"] == usage["embedding_optimizer"] == expected_memory(plan, rank), usage
        held = usage["embedding_weights"] + usage["embedding_optimizer"]
        if device.type == "cuda":
            assert usage["embedding_device"] == held and usage["embedding_host"] == 0, usage
            assert usage["cuda_max_allocated"] >= held, usage  # the allocator holds at least the shards
        results.append({"rank": rank, "case": case, "device": str(device), **usage})
    if rank == 0:
        with open(result_file, "w") as handle:
            json.dump(results, handle)
