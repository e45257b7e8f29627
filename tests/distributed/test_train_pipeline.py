"""TrainPipelineSparseDist (rectoolkit.distributed.train_pipeline) against the plain training loop.

2 ranks (gloo): for a table-wise, a row-wise and a mixed plan (row-wise + data-parallel + column-wise) of an
EmbeddingBagCollection and a row-wise EmbeddingCollection, N steps
through the pipeline give bit-identical losses at every step and bit-identical weights (tables, Adagrad'd in
backward, and the dense part, Adam) at the end; every batch is trained on and StopIteration comes at the end.
In this process (world size 1): the same at world size 1, execute_all_batches=False, TrainPipelineBase, and
the errors.
"""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from torch import nn

from rectoolkit.plan.types import ShardingType
from rectoolkit.sparse import KeyedJaggedTensor
from rectoolkit.distributed import TrainPipelineBase, TrainPipelineSparseDist, full_state_dict
from rectoolkit.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDistLite
from dist_harness import run_workers
from dist_pipeline_workers import (
    assert_identical,
    batches,
    build,
    check_pipelined,
    check_eval_pipeline,
    count_own_input_dists,
    epochs_and_detach_worker,
    eval_pipeline_worker,
    local_env,
    pipeline_worker,
    PATH,
    pipelined,
    plain_loop,
    torchrec_steps_worker,
    train_epochs,
)

STEPS = 5


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_pipeline_equals_the_plain_loop_on_two_ranks():
    run_workers(pipeline_worker, 2, ["table_wise", "row_wise", "mixed_a", "sequence_row_wise"], STEPS)


@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_pipeline_equals_the_plain_loop_in_one_process(case):
    data = batches(0, 1, STEPS, case)
    plain = plain_loop(case, data, 1, local_env())
    losses, state, info = pipelined(case, data, 1, local_env())
    check_pipelined(0, case, info)
    assert_identical(0, case, plain, (losses, state), STEPS)


COUNTS = [1, 2, 3, 5]


@pytest.mark.parametrize("steps", COUNTS)
def test_execute_all_batches_false_stops_with_the_dataloader(steps):
    # TorchRec's rule (train_pipelines.py, enqueue_batch): the pipeline stops when batch i+2 cannot be loaded
    data = batches(0, 1, steps)
    losses, *_ = pipelined("table_wise", data, 1, local_env(), execute_all_batches=False)
    assert len(losses) == max(0, steps - 2)
    losses, *_ = pipelined("table_wise", data, 1, local_env(), execute_all_batches=True)
    assert len(losses) == steps


@pytest.mark.torchrec
@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_as_many_batches_are_trained_on_as_torchrecs_pipeline_trains_on(tmp_path):
    pytest.importorskip("torchrec")
    out_file = str(tmp_path / "torchrec_steps.pt")
    run_workers(torchrec_steps_worker, 1, COUNTS, out_file)  # TorchRec's DMP needs a process group
    torchrec_steps = torch.load(out_file)
    ours = {}
    for key in torchrec_steps:
        if key[0] == "epochs":  # three epochs of 3 batches through one pipeline, reset() after each or not
            _, execute_all, reset = key
            dmp, optimizer = build("table_wise", 1, local_env())
            pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), execute_all_batches=execute_all)
            ours[key] = train_epochs(pipeline, [batches(0, 1, 3)] * 3, reset)
        else:
            *fused, execute_all, count = key
            ours[key] = len(pipelined("table_wise", batches(0, 1, count), 1, local_env(), execute_all_batches=execute_all,
                                      pipeline_class="TrainPipelineFusedSparseDist" if fused else
                                      "TrainPipelineSparseDist")[0])
    assert ours == torchrec_steps
    # TorchRec 1.8: a new iterator is read after the batches in flight; without execute_all_batches the two
    # loaded ahead train first in the next epoch; reset() drops them
    assert [torchrec_steps[("epochs", e, r)] for e, r in [(True, False), (False, False), (False, True)]] == [
        [3, 3, 3], [1, 3, 3], [1, 1, 1]]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_epochs_and_detach_attach_on_two_ranks():
    run_workers(epochs_and_detach_worker, 2, "row_wise", 4)


def test_epochs_and_detach_attach_in_one_process():
    epochs_and_detach_worker(0, 1, "mixed_a", 4, local_env())


def test_attach_another_model_goes_on_with_the_batches_in_flight():
    """attach(model) with another DMP (the same weights, e.g. reloaded): the batches loaded ahead train on it,
    its first step runs plain and the ones after are pipelined again; the weights equal the plain loop's."""
    data = batches(0, 1, 6, "table_wise")
    dmp, optimizer = build("table_wise", 1, local_env())
    pipeline, feed = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu")), iter(data)
    for _ in range(2):
        pipeline.progress(feed)
    other, other_optimizer = build("table_wise", 1, local_env())
    other.load_state_dict(full_state_dict(pipeline.detach()))
    other_optimizer.init_state()  # (Adam's state is created on its first step; TorchRec's rule too)
    other_optimizer.load_state_dict(optimizer.state_dict())
    pipeline._optimizer = other_optimizer  # (TorchRec's attach keeps the optimizer too: a user gives the new one)
    pipeline.attach(other)
    assert train_epochs(pipeline, [feed]) == [4]
    assert pipeline.pipelined_modules == [PATH]
    _, plain_state = plain_loop("table_wise", data, 1, local_env())
    whole = full_state_dict(other)  # (a collective: once, outside the all())
    assert all(torch.equal(whole[k], v) for k, v in plain_state.items())
    with pytest.raises(ValueError, match="not a DistributedModelParallel"):
        pipeline.attach(nn.Linear(2, 1))
    with pytest.raises(TypeError, match="sparse_dist"):
        pipeline.attach(sparse_dist="yes")


def test_train_pipeline_base_reads_each_new_iterator_and_reset_drops_the_loaded_batch():
    model = nn.Linear(2, 1)
    forward = lambda x: ((model(x) ** 2).mean(), None)  # noqa: E731
    pipeline = TrainPipelineBase(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                                 custom_model_fwd=forward)
    data = [torch.ones(4, 2)] * 3
    assert train_epochs(pipeline, [data] * 3) == [3, 3, 3]
    feed = iter(data)
    pipeline.progress(feed)  # batch 1 is loaded ahead
    pipeline.reset()
    assert train_epochs(pipeline, [feed]) == [1]  # batch 1, loaded ahead, was dropped: only batch 2 is left
    assert train_epochs(pipeline, [data]) == [3]


def test_the_ids_of_the_next_batch_travel_during_the_whole_step():
    # at forward i the ids of batch i+1 are already sent and the sizes of batch i+2 too (TorchRec sends the ids
    # of batch i+1 after forward i): counted as started exchanges, one per routed group and batch
    dmp, optimizer = build("table_wise", 1, local_env())
    routed = sum(g.sharding_type != ShardingType.DATA_PARALLEL for g in dmp.sharded_modules[PATH].groups.values())
    started = []

    def forward(batch):
        calls = dmp.env.stats.calls
        started.append((calls.get("metadata", 0) // routed, calls.get("input_dist", 0) // routed))
        return dmp(batch)

    # on the calling thread, so that the counts at forward are exact (the default thread runs alongside forward)
    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), custom_model_fwd=forward,
                                       background_input_dist=False)
    feed = iter(batches(0, 1, 6))
    for _ in range(6):
        pipeline.progress(feed)
    # step 0 runs plain; at forward i >= 1: sizes of batches 0..i+2, ids of batches 0..i+1 (at most the 6 batches)
    assert started == [(0, 0)] + [(min(i + 2, 5) + 1, min(i + 1, 5) + 1) for i in range(1, 6)]


@pytest.mark.parametrize("background", [True, False])
def test_the_work_ahead_runs_on_the_pipelines_thread_with_the_same_numbers(background):
    data = batches(0, 1, STEPS, "mixed_a")
    plain = plain_loop("mixed_a", data, 1, local_env())
    dmp, optimizer = build("mixed_a", 1, local_env())
    collection = dmp.sharded_modules[PATH]
    threads = []
    collection.start_input_dist = lambda features, env=None, original=collection.start_input_dist: (
        threads.append(threading.current_thread().name) or original(features, env))
    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), background_input_dist=background)
    feed = iter(data)
    losses = [pipeline.progress(feed) for _ in data]
    # batches 1 and 2 start after the first forward, on the calling thread; batches 3, 4 during steps 1, 2
    main = threading.current_thread().name
    assert threads == [main, main] + ["rectoolkit-input-dist" if background else main] * (STEPS - 3)
    assert all(torch.equal(a, b) for a, b in zip(losses, plain[0]))
    whole = full_state_dict(dmp)  # (a collective: once, outside the all())
    assert all(torch.equal(v, whole[k]) for k, v in plain[1].items())


@pytest.mark.parametrize("background", [True, False])
def test_an_id_out_of_range_in_a_later_batch_is_raised_by_a_step(background):
    dmp, optimizer = build("table_wise", 1, local_env())
    data = batches(0, 1, 5)
    kjt = data[3].sparse_features
    data[3] = data[3]._replace(sparse_features=KeyedJaggedTensor.from_lengths_sync(
        kjt.keys(), torch.full_like(kjt.values(), 10 ** 9), kjt.lengths()))
    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), background_input_dist=background)
    feed = iter(data)
    # batch 3's input_dist starts during step 1: on the calling thread it raises there, on the pipeline's thread
    # at the start of step 2
    for _ in range(2 if background else 1):
        pipeline.progress(feed)
    with pytest.raises(ValueError, match="1000000000"):
        pipeline.progress(feed)


def test_the_pipelines_thread_ends_with_the_pipeline():
    dmp, optimizer = build("table_wise", 1, local_env())
    before = set(threading.enumerate())
    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))
    feed = iter(batches(0, 1, 4))
    for _ in range(4):
        pipeline.progress(feed)
    (worker,) = [t for t in threading.enumerate() if t not in before]
    assert worker.name == "rectoolkit-input-dist" and worker.daemon  # a failing rank does not wait for it
    del pipeline, feed
    gc.collect()
    worker.join(timeout=60)
    assert not worker.is_alive()


def test_a_collection_fed_a_computed_kjt_keeps_its_input_dist_in_forward():
    dmp, optimizer = build("table_wise", 1, local_env())
    features = ["f0", "f0b", "f1", "f2"]

    def forward(batch):  # the collection gets a KJT the forward makes, not a field of the batch
        return dmp(batch._replace(sparse_features=batch.sparse_features.permute(list(range(len(features))))))

    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), custom_model_fwd=forward)
    data = batches(0, 1, 3)
    feed = iter(data)
    losses = [pipeline.progress(feed) for _ in data]
    assert pipeline.pipelined_modules == []
    plain, _ = plain_loop("table_wise", data, 1, local_env())
    assert all(torch.equal(a, b) for a, b in zip(losses, plain))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_eval_pipeline_gives_the_plain_forwards_on_two_ranks():
    run_workers(eval_pipeline_worker, 2, ["row_wise", "sequence_row_wise"], STEPS)


@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_eval_pipeline_gives_the_plain_forwards_and_changes_no_weight(case):
    """TorchRec's EvalPipelineSparseDist: each progress() returns the model's output for the next batch, with the
    input_dist of the batches after it run ahead; no backward, no step; StopIteration after the last batch."""
    check_eval_pipeline(0, 1, case, STEPS, local_env())


@pytest.mark.parametrize("background", [True, False])
def test_a_dataloader_that_raises_mid_way_raises_from_progress_and_the_batches_before_it_train(background):
    """The loader's error comes out of the progress() that loads; progress() goes on with the batches already
    loaded, so the weights equal the plain loop's over the batches the loader gave."""
    data = batches(0, 1, STEPS, "row_wise")

    def loader():
        yield from data[:3]
        raise RuntimeError("the loader broke after 3 batches")

    dmp, optimizer = build("row_wise", 1, local_env())
    pipeline, feed = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), background_input_dist=background), loader()
    trained, raised = 0, 0
    while True:
        try:
            pipeline.progress(feed)
            trained += 1
        except StopIteration:
            break
        except RuntimeError as error:
            assert "loader broke" in str(error)
            raised += 1
    _, plain_state = plain_loop("row_wise", data[:3], 1, local_env())
    assert (trained, raised) == (3, 1)
    whole = full_state_dict(dmp)  # (a collective: once, outside the all())
    assert all(torch.equal(v, whole[k]) for k, v in plain_state.items())


def test_train_pipeline_base_equals_the_plain_loop():
    def run(use_pipeline: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        data = [torch.randn(5, 3, generator=torch.Generator().manual_seed(s)) for s in range(4)]
        forward = lambda x: ((model(x) ** 2).mean(), None)  # noqa: E731
        if use_pipeline:
            pipeline, feed = TrainPipelineBase(model, optimizer, torch.device("cpu"), custom_model_fwd=forward), iter(data)
            for _ in data:
                pipeline.progress(feed)
            with pytest.raises(StopIteration):
                pipeline.progress(feed)
        else:
            for x in data:
                optimizer.zero_grad()
                forward(x)[0].backward()
                optimizer.step()
        return [p.detach().clone() for p in model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(run(True), run(False)))


def test_errors_name_the_problem_and_the_fix():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="not a DistributedModelParallel.*TrainPipelineBase"):
        TrainPipelineSparseDist(model, optimizer, torch.device("cpu"))
    dmp, dmp_optimizer = build("table_wise", 1, local_env())
    for name, value in [("apply_jit", True), ("enqueue_batch_after_forward", True), ("free_features_storage_early", True),
                        ("clear_data_dist_inputs", True), ("pipeline_postproc", True), ("enable_inplace_copy_batch", True)]:
        with pytest.raises(NotImplementedError, match=name):
            TrainPipelineSparseDist(dmp, dmp_optimizer, torch.device("cpu"), **{name: value})
    for interval in (0, 1.5):
        with pytest.raises(ValueError, match=rf"dmp_collection_sync_interval_batches={interval}\).*an int >= 1"):
            TrainPipelineSparseDist(dmp, dmp_optimizer, torch.device("cpu"), dmp_collection_sync_interval_batches=interval)
    pipeline = TrainPipelineSparseDist(dmp, dmp_optimizer, torch.device("cpu"))
    with pytest.raises(TypeError, match="takes an iterator.*iter\\(dataloader\\)"):
        pipeline.progress(batches(0, 1, 2))  # a list, not an iterator
    with pytest.raises(StopIteration):
        pipeline.progress(iter([]))  # an empty iterator: nothing to train on, as in TorchRec
    with pytest.raises(TypeError, match="must have .to"):
        TrainPipelineSparseDist(dmp, dmp_optimizer, torch.device("cpu")).progress(iter([{"ids": [1, 2]}]))


@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_lite_pipeline_equals_the_plain_loop_with_each_input_dist_in_its_own_forward(case):
    """TorchRec's TrainPipelineSparseDistLite: one batch in flight, nothing run ahead: every forward runs its own
    input_dist; the plain loop's losses and weights bit for bit; StopIteration at the end and again after."""
    data = batches(0, 1, STEPS, case)
    plain = plain_loop(case, data, 1, local_env())
    dmp, optimizer = build(case, 1, local_env())
    own_input_dists, routed = count_own_input_dists(dmp, case)
    pipeline = TrainPipelineSparseDistLite(dmp, optimizer, torch.device("cpu"))
    feed, losses = iter(data), []
    with pytest.raises(StopIteration):
        while True:
            losses.append(pipeline.progress(feed))
    with pytest.raises(StopIteration):
        pipeline.progress(feed)
    assert pipeline.pipelined_modules == [] and len(pipeline._batches) == 0
    assert len(own_input_dists) == len(routed) * STEPS
    assert_identical(0, case, plain, (losses, full_state_dict(dmp)), STEPS)


def torchrec_lite_epochs_worker(rank: int, W: int, out_file: str) -> None:
    """How many batches TorchRec 1.8's TrainPipelineSparseDistLite trains on in three epochs of 3 batches (each
    from a new iterator), with reset() after each or not."""
    from torchrec.datasets.utils import Batch as TorchRecBatch
    from torchrec.distributed.model_parallel import DistributedModelParallel as TorchRecDMP
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDistLite as TorchRecLite
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor as TorchRecKJT

    from dist_pipeline_workers import _TorchRecModel

    def batch(i: int):
        kjt = TorchRecKJT.from_lengths_sync(["f"], torch.tensor([i % 10, 1]), torch.tensor([1, 1]))
        return TorchRecBatch(dense_features=torch.zeros(2, 1), sparse_features=kjt, labels=torch.zeros(2))

    counts = {}
    for reset in (False, True):
        dmp = TorchRecDMP(_TorchRecModel(), device=torch.device("cpu"))
        pipeline = TorchRecLite(dmp, torch.optim.SGD(dmp.parameters(), lr=0.1), torch.device("cpu"))
        counts[reset] = train_epochs(pipeline, [[batch(i) for i in range(3)]] * 3, reset)
    torch.save(counts, out_file)


@pytest.mark.torchrec
def test_lite_pipeline_trains_as_many_batches_per_epoch_as_torchrecs(tmp_path):
    pytest.importorskip("torchrec")
    out_file = str(tmp_path / "torchrec_lite.pt")
    run_workers(torchrec_lite_epochs_worker, 1, out_file)
    theirs = torch.load(out_file)
    for reset in (False, True):
        dmp, optimizer = build("table_wise", 1, local_env())
        pipeline = TrainPipelineSparseDistLite(dmp, optimizer, torch.device("cpu"))
        assert train_epochs(pipeline, [batches(0, 1, 3)] * 3, reset) == theirs[reset], reset
