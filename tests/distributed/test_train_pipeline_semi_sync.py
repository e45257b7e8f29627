"""TrainPipelineSemiSync (rectoolkit.distributed.train_pipeline.train_pipelines) against TorchRec 1.8's own, and
against the plain loop where it must equal it.

TorchRec's TrainPipelineSemiSync runs on CPU gloo once its stream calls are no-ops (dist_harness.run_cpu_shims);
both libraries train the same model (fused SGD tables, table-wise and row-wise, of an EmbeddingBagCollection or an
EmbeddingCollection under a nonlinear dense part) from the same weights on the same batches, on 1 and on 2 ranks:
the same number of batches, losses and weights (to float tolerance: fbgemm's kernels against rectoolkit's), and
different weights from the plain loop's. With start_batch past the last batch, every step looks its batch up on the updated tables: the plain loop
bit for bit, for bag and sequence collections and a data-parallel table.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from rectoolkit.distributed import full_state_dict
from rectoolkit.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync
from dist_harness import run_workers
from dist_pipeline_workers import assert_identical, batches, build, local_env, path_of, plain_loop
from dist_semi_sync_workers import semi_sync_vs_torchrec_worker

STEPS = 6


@pytest.mark.torchrec
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_semi_sync_equals_torchrecs_in_one_process():
    pytest.importorskip("torchrec")
    # (start_batch, stash_gradients, execute_all_batches, sequences); TorchRec's DMP needs a process group: a
    # spawned worker
    run_workers(semi_sync_vs_torchrec_worker, 1, [(0, False, True, False), (2, True, False, False),
                                                  (0, True, True, False), (STEPS + 3, False, True, False),
                                                  (0, False, True, True), (2, True, False, True)], STEPS)


@pytest.mark.torchrec
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_semi_sync_equals_torchrecs_on_two_ranks():
    pytest.importorskip("torchrec")
    run_workers(semi_sync_vs_torchrec_worker, 2, [(2, True, False, False), (0, False, True, True)], STEPS)


def semi_sync(case: str, data, start_batch: int, **kwargs):
    dmp, optimizer = build(case, 1, local_env())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # build()'s CombinedOptimizer holds the fused tables: the check warns
        pipeline = TrainPipelineSemiSync(dmp, optimizer, torch.device("cpu"), start_batch=start_batch, **kwargs)
        feed = iter(data)
        losses = [pipeline.progress(feed) for _ in data]
    with pytest.raises(StopIteration):
        pipeline.progress(feed)
    return losses, full_state_dict(dmp), pipeline


@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_before_start_batch_every_step_is_the_plain_loops(case):
    """Lookups on the updated tables, detached for the forward, back-propagated after the dense backward: the plain
    loop's numbers bit for bit (mixed_a holds a data-parallel table, stepped by the dense optimizer)."""
    data = batches(0, 1, STEPS, case)
    losses, state, pipeline = semi_sync(case, data, start_batch=STEPS)
    assert pipeline.pipelined_modules == [path_of(case)]
    assert_identical(0, case, plain_loop(case, data, 1, local_env()), (losses, state), STEPS)


@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_from_start_batch_on_the_weights_leave_the_plain_loops(case):
    """The steps before start_batch equal the plain loop's; from its next step on, the losses differ."""
    data = batches(0, 1, STEPS, case)
    plain_losses, _ = plain_loop(case, data, 1, local_env())
    losses, state, _ = semi_sync(case, data, start_batch=2)
    # step 2 looks batch 3 up before its update: batches 0..3 train as in the plain loop, batch 3 on stale tables
    assert all(torch.equal(a, b) for a, b in zip(losses[:3], plain_losses[:3]))
    assert not torch.equal(losses[3], plain_losses[3])


def test_errors_name_the_problem_and_the_fix():
    dmp, optimizer = build("table_wise", 1, local_env())
    with pytest.raises(ValueError, match="start_batch=-1"):
        TrainPipelineSemiSync(dmp, optimizer, torch.device("cpu"), start_batch=-1)
    with pytest.raises(NotImplementedError, match="apply_jit"):
        TrainPipelineSemiSync(dmp, optimizer, torch.device("cpu"), apply_jit=True)
    data = batches(0, 1, 3)
    # strict: an optimizer holding the tables (build()'s CombinedOptimizer holds the fused one) is refused
    pipeline = TrainPipelineSemiSync(dmp, optimizer, torch.device("cpu"), start_batch=0, strict=True)
    with pytest.raises(ValueError, match="dense parameters only"):
        pipeline.progress(iter(data))
    dmp, optimizer = build("table_wise", 1, local_env())
    with pytest.warns(UserWarning, match="in_backward_optimizer_filter"):
        TrainPipelineSemiSync(dmp, optimizer, torch.device("cpu"), start_batch=0).progress(iter(data))
