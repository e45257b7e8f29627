"""StagedTrainPipeline, PipelineStage and SparseDataDistUtil (rectoolkit.distributed.train_pipeline).

The order of the stage calls, callbacks and outputs equals TorchRec 1.8's StagedTrainPipeline on the same stages
and batches (it runs on CPU with CPU streams), flushing included. With SparseDataDistUtil's stage last, the caller's
loop gives the plain loop's losses and weights bit for bit, on 1 and 2 gloo ranks, with the collection's input_dist
run ahead (the forward runs its own on the first step only).
"""

from __future__ import annotations

import pytest
import torch

from rectoolkit.distributed import full_state_dict
from torch import nn

from rectoolkit.distributed.train_pipeline import PipelineStage, SparseDataDistUtil, StagedTrainPipeline
from dist_harness import run_workers
from dist_pipeline_workers import assert_identical, batches, build, local_env, plain_loop
from dist_staged_workers import check_staged, staged, staged_worker

STEPS = 5


class Item:
    """A batch for the generic stages: a number, with the record_stream TorchRec's pipeline calls."""

    def __init__(self, value: int) -> None:
        self.value = value

    def record_stream(self, stream) -> None:
        pass


def run_stages(stage_class, pipeline_class, stream, flush_at=None, **pipeline_kwargs):
    """Three stages over 4 batches, 7 progress() calls (set_flush(True) before call `flush_at`): every call,
    callback and output, in order."""
    calls = []

    def stage(name, f):
        def run(item):
            calls.append((name, item.value))
            return Item(f(item.value))
        return run

    def callback(what):
        return lambda: calls.append(what)

    stages = [stage_class("a", stage("a", lambda v: v * 10), stream, fill_callback=callback("fill a"),
                          data_exhausted_callback=callback("exhausted a")),
              stage_class("b", stage("b", lambda v: v + 1), stream, fill_callback=callback("fill b"),
                          data_exhausted_callback=callback("exhausted b")),
              stage_class("c", stage("c", lambda v: -v), stream)]
    pipeline = pipeline_class(stages, on_flush_end=callback("flush end"), **pipeline_kwargs)
    feed = iter([Item(i) for i in range(6)])
    for call in range(9):
        if call == flush_at:
            pipeline.set_flush(True)
        out = pipeline.progress(feed)
        calls.append(("out", None if out is None else out.value))
    return calls


@pytest.mark.torchrec
@pytest.mark.parametrize("flush_at", [None, 2])
def test_the_stages_run_in_torchrecs_order(flush_at):
    pytest.importorskip("torchrec")
    from torchrec.distributed.train_pipeline import StagedTrainPipeline as TheirStaged
    from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage as TheirStage

    cpu = torch.Stream(device="cpu")  # TorchRec's pipeline needs a stream with a device, on CPU too
    theirs = run_stages(TheirStage, TheirStaged, cpu, flush_at, compute_stream=cpu)
    assert run_stages(PipelineStage, StagedTrainPipeline, None, flush_at) == theirs
    assert run_stages(PipelineStage, StagedTrainPipeline, cpu, flush_at, compute_stream=cpu) == theirs
    outputs = [value for what, value in (c for c in theirs if isinstance(c, tuple)) if what == "out"]
    if flush_at is None:
        assert outputs == [-1, -11, -21, -31, -41, -51, None, None, None]


@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_sparse_data_dist_stage_gives_the_plain_loop_in_one_process(case):
    data = batches(0, 1, STEPS, case)
    plain = plain_loop(case, data, 1, local_env())
    for copy_stage in (True, False):
        losses, state, info = staged(case, data, 1, local_env(), copy_stage=copy_stage)
        check_staged(0, case, info)
        assert_identical(0, case, plain, (losses, state), STEPS)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_sparse_data_dist_stage_gives_the_plain_loop_on_two_ranks():
    run_workers(staged_worker, 2, [("row_wise", True), ("sequence_row_wise", False)], STEPS)


def test_detach_hands_the_model_back_and_the_next_stage_reattaches():
    """After two steps, detach(): the model called on another batch gives the plain model's output (its own
    input_dist); the batches in flight are kept and training goes on to the plain loop's weights."""
    data, probe = batches(0, 1, STEPS), batches(0, 1, STEPS + 1)[-1]
    plain, plain_optimizer = build("table_wise", 1, local_env())
    dmp, optimizer = build("table_wise", 1, local_env())
    sdd = SparseDataDistUtil(dmp)
    pipeline = StagedTrainPipeline([sdd.start_sparse_data_dist_stage()])
    feed = iter(data)

    def step(model, model_optimizer, batch):
        model_optimizer.zero_grad()
        model(batch)[0].backward()
        model_optimizer.step()

    for batch in data[:2]:
        step(plain, plain_optimizer, batch)
        step(dmp, optimizer, pipeline.progress(feed))
    assert sdd.detach() is dmp
    with torch.no_grad():
        assert torch.equal(dmp(probe)[1], plain(probe)[1])
    while (batch := pipeline.progress(feed)) is not None:
        step(dmp, optimizer, batch)
    assert sdd.initialized and sdd.pipelined_modules == ["model.sparse.ebc"]
    _, plain_state = plain_loop("table_wise", data, 1, local_env())
    whole = full_state_dict(dmp)  # (a collective: once, outside the all())
    assert all(torch.equal(whole[k], v) for k, v in plain_state.items())


def test_errors_name_the_problem_and_the_fix():
    dmp, optimizer = build("table_wise", 1, local_env())
    for name, value in [("apply_jit", True), ("prefetch_stream", torch.Stream(device="cpu")),
                        ("embedding_lookup_stream", torch.Stream(device="cpu"))]:
        with pytest.raises(NotImplementedError, match=name):
            SparseDataDistUtil(dmp, **{name: value})
    with pytest.raises(ValueError, match="not a DistributedModelParallel"):
        SparseDataDistUtil(nn.Linear(2, 1))
    with pytest.raises(TypeError, match="PipelineStage"):
        StagedTrainPipeline([lambda batch: batch])
    with pytest.raises(ValueError, match="at least one"):
        StagedTrainPipeline([])
    with pytest.raises(TypeError, match="iter\\(dataloader\\)"):
        StagedTrainPipeline([PipelineStage("copy", lambda batch: batch)]).progress([1, 2])
    # pipeline_postproc=True and a collection fed a KJT the model computes: refused on the first forward
    sdd = SparseDataDistUtil(dmp, pipeline_postproc=True)
    pipeline = StagedTrainPipeline([sdd.start_sparse_data_dist_stage()])
    inner = dmp.module
    forward = inner.forward
    inner.forward = lambda batch: forward(batch._replace(sparse_features=batch.sparse_features.permute(
        list(range(len(batch.sparse_features.keys()))))))
    with pytest.raises(NotImplementedError, match=r"\['model.sparse.ebc'\].*pipeline_postproc=False"):
        dmp(pipeline.progress(iter(batches(0, 1, 3))))
