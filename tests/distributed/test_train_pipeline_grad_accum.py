"""Gradient accumulation (rectoolkit.distributed.train_pipeline.gradient_accumulation) against TorchRec 1.8's own
GradientAccumulationWrapper and against a loop that accumulates by hand.

Both libraries wrap their TrainPipelineSparseDist (TorchRec's runs on CPU gloo with dist_harness.run_cpu_shims)
around the same model (fused SGD tables, table-wise and row-wise, under a dense part stepped by SGD), weights and
batches, on 1 and 2 ranks: the same losses, weights and DDP all-reduce pattern (no_sync between a group's first and
last micro-batch); full groups, a partial last group flushed at StopIteration and one flagged is_last_batch.
Without TorchRec installed, the hand loop's comparison still runs.
"""

from __future__ import annotations

import pytest

from rectoolkit.distributed.train_pipeline import GradientAccumulationConfig
from dist_grad_accum_workers import grad_accum_worker
from dist_harness import run_workers


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_accumulation_equals_torchrecs_and_the_hand_loop_in_one_process():
    # (num_steps, steps, is_last_batch on the last call); TorchRec's DMP needs a process group: a spawned worker
    run_workers(grad_accum_worker, 1, [(2, 6, False), (3, 5, False)])


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_accumulation_equals_torchrecs_and_the_hand_loop_on_two_ranks():
    run_workers(grad_accum_worker, 2, [(3, 5, True), (3, 5, False)])


def test_config_refuses_what_torchrec_refuses_and_turns_itself_on():
    assert GradientAccumulationConfig(num_steps=3).is_enabled
    assert not GradientAccumulationConfig().is_enabled
    with pytest.raises(ValueError, match="num_steps must be >= 1"):
        GradientAccumulationConfig(num_steps=0)
    with pytest.raises(ValueError, match="num_warmup_steps must be >= 1"):
        GradientAccumulationConfig(num_warmup_steps=0)
