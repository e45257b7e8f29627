"""Workers of the distributed gpu tests (importable by spawned processes): DistributedModelParallel with its
shards and dense part on a CUDA device, against the unsharded model on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv, load_checkpoint, save_checkpoint
from rectoolkit.optim import CombinedOptimizer
from rectoolkit.plan.types import ShardingPlan
from dist_dmp_workers import PATH, TinyModel, expected_memory, step_batches
from dist_harness import global_batch
from dist_workers import BATCH, bag_tables, plan_for
from quant_dist_workers import batch as quant_batch
from quant_dist_workers import plan as quant_plan
from quant_dist_workers import tables as quant_tables


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
        # checkpoint on the GPU, reload under the other plan: the same weights, back on the GPU
        checkpoint_dir = Path(result_file).parent / f"checkpoint_{case}"
        save_checkpoint(dmp, checkpoint_dir)
        other_case = "mixed_b" if case == "mixed_a" else "mixed_a"
        torch.manual_seed(123)
        other = DistributedModelParallel(TinyModel(), plan=ShardingPlan({PATH: plan_for(other_case, bag_tables(), W, W)}),
                                         device=device)
        load_checkpoint(other, checkpoint_dir)
        reloaded = other.state_dict()
        assert all(reloaded[k].device == device and torch.equal(reloaded[k], v) for k, v in state.items()), \
            f"rank {rank}: the checkpoint saved under {case} and loaded under {other_case} changed the weights"
        results.append({"rank": rank, "case": case, "device": str(device), **usage})
    if rank == 0:
        with open(result_file, "w") as handle:
            json.dump(results, handle)


def quant_sharded_worker(rank: int, W: int, device_template: str, result_file: str) -> None:
    """Sharded quantized inference (tests/quant/quant_dist_workers.py's plan: table-, row- and column-wise) with
    the shards on `device`: table- and row-wise columns equal the unsharded quantized collection on the CPU."""
    from rectoolkit.quant import QuantEmbeddingBagCollection
    from rectoolkit.quant.sharding import shard_quant_embedding_bag_collection

    device = torch.device(device_template.format(rank=rank))
    env = ShardingEnv.from_process_group(device=device)
    results = []
    for dtype in (torch.int8, torch.quint4x2):
        torch.manual_seed(0)
        qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(quant_tables()), dtype=dtype,
                                                      backend="torch")
        sharded = shard_quant_embedding_bag_collection(qebc, quant_plan(W), env, backend="torch")
        out = sharded(quant_batch(rank, False).to(device)).values()
        assert out.device == device, f"rank {rank}: output on {out.device}"
        expected = qebc(quant_batch(rank, False)).values()
        tw_rw = 16 * 3  # features a, b, c: table-wise and row-wise shards hold the stored bytes unchanged
        difference = float((out.cpu()[:, :tw_rw] - expected[:, :tw_rw]).abs().max())
        assert difference <= 1e-5, f"rank {rank}, {dtype}: sharded on {device} differs by {difference}"
        results.append({"rank": rank, "dtype": str(dtype), "max_diff_tw_rw": difference})
    if rank == 0:
        with open(result_file, "w") as handle:
            json.dump(results, handle)



def pipeline_device_worker(rank: int, W: int, device_template: str, cases: list, steps: int) -> None:
    """TrainPipelineSparseDist with the model on `device`: batches copied ahead (a side stream on CUDA), the next
    batch's ids sent while this one trains; losses at every step and every weight at the end identical to the
    plain loop's on the same device."""
    from dist_pipeline_workers import assert_identical, batches, check_pipelined, pipelined, plain_loop

    device = torch.device(device_template.format(rank=rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    for case in cases:
        data = batches(rank, W, steps, case)
        plain = plain_loop(case, data, W, ShardingEnv.from_process_group(device=device), device=str(device))
        losses, state, info = pipelined(case, data, W, ShardingEnv.from_process_group(device=device),
                                        device=str(device))
        check_pipelined(rank, case, info)
        assert info["side_stream"] == (device.type == "cuda"), f"rank {rank} {case}: side stream {info['side_stream']}"
        assert all(loss.device == device for loss in losses), f"rank {rank} {case}: losses on {losses[0].device}"
        assert all(t.device == device for t in state.values()), f"rank {rank} {case}: state not all on {device}"
        assert_identical(rank, case, plain, (losses, state), steps)


def vbe_device_worker(rank: int, W: int, device_template: str, cases: list, result_file: str) -> None:
    """VBE batches (a batch size per feature, inverse indices) through the sharded EmbeddingBagCollection with its
    shards on `device`, (case, local_world_size) pairs: the output, and every shard after one fused-SGD step, equal
    the unsharded collection on the CPU over every rank's batch."""
    from dist_vbe_workers import fused_update_diffs, vbe_reference_step
    from rectoolkit.distributed import shard_embedding_bag_collection

    device, lr = torch.device(device_template.format(rank=rank)), 0.5
    tables = bag_tables()
    results = []
    for case, L in cases:
        env = ShardingEnv.from_process_group(local_world_size=L, device=device)
        batches, reference, ref_outs, grads_out, local = vbe_reference_step(tables, W, seed=29, grad_seed=6, lr=lr)
        sharded = shard_embedding_bag_collection(local, plan_for(case, tables, W, L), env)
        out = sharded(batches[rank].to(device)).values()
        assert out.device == device, f"rank {rank}, {case}: output on {out.device}"
        out_diff = float((out.detach().cpu() - ref_outs[rank].detach()).abs().max())
        assert out_diff <= 1e-5, f"rank {rank}, {case}: VBE outputs on {device} differ by {out_diff}"
        (out * grads_out[rank].to(device)).sum().backward()
        assert all(weight.device == device for _, _, weight, _ in sharded.local_shards()), f"rank {rank}, {case}"
        update_diff = max(fused_update_diffs(sharded, reference, lr).values(), default=0.0)
        assert update_diff <= 1e-5, f"rank {rank}, {case}: fused SGD after a VBE step differs by {update_diff}"
        results.append({"rank": rank, "case": case, "max_output_diff": out_diff, "max_update_diff": update_diff})
    if rank == 0:
        with open(result_file, "w") as handle:
            json.dump(results, handle)
