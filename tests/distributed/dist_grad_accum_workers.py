"""Workers of the gradient accumulation tests: TorchRec 1.8's GradientAccumulationWrapper and rectoolkit's, each
around its library's TrainPipelineSparseDist, on the same model, weights, plan and batches as the semi-sync tests
(fused SGD tables, dense SGD), and a loop that accumulates by hand (importable by spawned processes)."""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any, List, Tuple

import torch
from torch import nn

import rectoolkit as rtk
from dist_harness import run_cpu_shims
from dist_semi_sync_workers import assert_state_close, batches, build, local_slices, unsharded_weights


def _ddp_of(dmp) -> Any:
    wrapped = dmp._dmp_wrapped_module
    return wrapped if isinstance(wrapped, nn.parallel.DistributedDataParallel) else None


def _record_syncs(dmp) -> List[bool]:
    """Whether DDP all-reduces, seen at each forward of the dense part (empty on one rank: no DDP)."""
    syncs: List[bool] = []
    ddp = _ddp_of(dmp)
    if ddp is not None:
        dmp.module.dense.register_forward_pre_hook(lambda *_: syncs.append(bool(ddp.require_backward_grad_sync)))
    return syncs


def accumulated(lib, W: int, rank: int, num_steps: int, steps: int, last_flag: bool):
    """`steps` batches through lib's TrainPipelineSparseDist under lib's GradientAccumulationWrapper (num_steps);
    with last_flag the last call says is_last_batch=True. Losses, state pieces and the DDP syncs seen."""
    if lib is rtk:
        from rectoolkit.distributed.train_pipeline import gradient_accumulation as ga
    else:
        from torchrec.distributed.train_pipeline import gradient_accumulation as ga
    dmp, optimizer = build(lib, W, unsharded_weights(False), False)
    syncs = _record_syncs(dmp)
    pipeline = lib.distributed.train_pipeline.TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))
    wrapped = ga.GradientAccumulationWrapper(pipeline, optimizer, dmp,
                                             ga.GradientAccumulationConfig(num_steps=num_steps))
    feed, losses = iter(batches(lib, rank, steps)), []
    for step in range(steps):
        losses.append(wrapped.progress(feed, is_last_batch=True if last_flag and step == steps - 1 else None))
    try:
        wrapped.progress(feed)
        raise AssertionError(f"rank {rank}: a batch after the last")
    except StopIteration:
        pass
    return losses, local_slices(dmp), syncs


def hand_loop(W: int, rank: int, num_steps: int, steps: int) -> Tuple[List[torch.Tensor], Any]:
    """Accumulation written out: zero_grad at each group's start, every micro-batch's loss backward unscaled (the
    fused tables update in each backward), DDP's all-reduce on the group's last micro-batch (and the first ever),
then step."""
    dmp, optimizer = build(rtk, W, unsharded_weights(False), False)
    ddp, losses = _ddp_of(dmp), []
    for step, batch in enumerate(batches(rtk, rank, steps)):
        if step % num_steps == 0:
            optimizer.zero_grad()
        last_of_group = (step + 1) % num_steps == 0 or step == steps - 1
        all_reduce = last_of_group or step == 0  # DDP's static graph needs the first backward all-reduced
        with contextlib.nullcontext() if all_reduce or ddp is None else ddp.no_sync():
            loss, _ = dmp(batch)
            loss.backward()
        if last_of_group:
            optimizer.step()
        losses.append(loss.detach())
    return losses, local_slices(dmp)


def grad_accum_worker(rank: int, W: int, settings: List[Tuple[int, int, bool]]) -> None:
    """For each (num_steps, steps, last_flag): rectoolkit's wrapper gives TorchRec's losses, weights and DDP sync
    pattern (when TorchRec is installed), and the hand loop's losses and weights, except on several ranks when the
    last group is partial and not flagged: TorchRec steps it from gradients not all-reduced (as rectoolkit's)."""
    with_torchrec = importlib.util.find_spec("torchrec") is not None
    if with_torchrec:
        run_cpu_shims()
    for num_steps, steps, last_flag in settings:
        where = f"rank {rank} num_steps={num_steps} steps={steps} is_last_batch={last_flag}"
        our_losses, ours, our_syncs = accumulated(rtk, W, rank, num_steps, steps, last_flag)
        expected_syncs = [step == 0 or (step + 1) % num_steps == 0 or (last_flag and step == steps - 1)
                          for step in range(steps)] if W > 1 else []
        assert our_syncs == expected_syncs, (where, our_syncs, expected_syncs)
        if with_torchrec:
            import torchrec

            their_losses, theirs, their_syncs = accumulated(torchrec, W, rank, num_steps, steps, last_flag)
            # TorchRec wraps the dense part in DDP on one rank too (no all-reduce to skip there); rectoolkit does not
            assert W == 1 or our_syncs == their_syncs, (where, our_syncs, their_syncs)
            torch.testing.assert_close(torch.stack(our_losses), torch.stack(their_losses),
                                       msg=lambda m: f"{where} losses against TorchRec's: {m}")
            assert_state_close(rank, where + " against TorchRec's", ours, theirs)
        if W == 1 or last_flag or steps % num_steps == 0:
            hand_losses, hand = hand_loop(W, rank, num_steps, steps)
            torch.testing.assert_close(torch.stack(our_losses), torch.stack(hand_losses),
                                       msg=lambda m: f"{where} losses against the hand loop: {m}")
            assert_state_close(rank, where + " against the hand loop", ours, hand)
