"""TrainPipelineFusedSparseDist and PrefetchTrainPipelineSparseDist (rectoolkit.distributed.train_pipeline) against
the plain training loop: bit-identical losses and weights on 1 and 2 gloo ranks; the fused pipeline's lookup of
batch i runs before its forward (and before or after the input_dist ahead, as asked); the arguments that cannot
work here are refused.
"""

from __future__ import annotations

import warnings
from functools import partial

import pytest
import torch

from rectoolkit.distributed.train_pipeline import (
    PrefetchTrainPipelineSparseDist,
    TrainPipelineFusedSparseDist,
    TrainPipelineSemiSync,
)
from dist_harness import run_workers
from dist_pipeline_workers import (
    PATH,
    assert_identical,
    batches,
    build,
    check_pipelined,
    local_env,
    path_of,
    pipeline_classes_worker,
    pipelined,
    plain_loop,
)

STEPS = 5
CLASSES = ["TrainPipelineFusedSparseDist", "PrefetchTrainPipelineSparseDist"]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_the_pipelines_equal_the_plain_loop_on_two_ranks():
    run_workers(pipeline_classes_worker, 2, [("TrainPipelineFusedSparseDist", "row_wise"),
                                             ("PrefetchTrainPipelineSparseDist", "sequence_row_wise"),
                                             ("TrainPipelineSparseDistCompAutograd", "mixed_a",
                                              {"compiled_autograd_options": {"backend": "eager"}})], STEPS)


@pytest.mark.parametrize("pipeline_class", CLASSES)
@pytest.mark.parametrize("case", ["mixed_a", "sequence_table_wise"])
def test_the_pipelines_equal_the_plain_loop_in_one_process(pipeline_class, case):
    data = batches(0, 1, STEPS, case)
    losses, state, info = pipelined(case, data, 1, local_env(), pipeline_class=pipeline_class)
    check_pipelined(0, case, info, path_of(case))
    assert_identical(0, case, plain_loop(case, data, 1, local_env()), (losses, state), STEPS)


@pytest.mark.parametrize("after_data_dist", [False, True])
def test_the_fused_pipeline_looks_batch_i_up_before_its_forward(after_data_dist):
    """Step i >= 1: the lookup of batch i, then (after_data_dist=False) the input_dist of batch i+2 starts, then the
    forward, which runs no lookup of its own; True: the input_dist ahead first. Step 0 runs plain (one lookup, in
    its forward)."""
    dmp, optimizer = build("table_wise", 1, local_env())
    collection = dmp.sharded_modules[PATH]
    events = []
    collection._run_groups.register_forward_pre_hook(lambda module, args: events.append("lookup"))
    collection.start_input_dist = lambda features, env=None, original=collection.start_input_dist: (
        events.append("input_dist ahead") or original(features, env))

    def forward(batch):
        events.append("forward")
        return dmp(batch)

    # on the calling thread, so that the order is exact (the default thread runs alongside the step)
    pipeline = TrainPipelineFusedSparseDist(dmp, optimizer, torch.device("cpu"), custom_model_fwd=forward,
                                            embedding_lookup_after_data_dist=after_data_dist,
                                            background_input_dist=False)
    data = batches(0, 1, 4)
    feed = iter(data)
    losses = [pipeline.progress(feed) for _ in data]
    step = ["input_dist ahead", "lookup"] if after_data_dist else ["lookup", "input_dist ahead"]
    # step 0: its forward looks up, then batches 1 and 2 start; step 1 starts batch 3; steps 2, 3 start nothing
    assert events == (["forward", "lookup", "input_dist ahead", "input_dist ahead"] + step + ["forward"]
                      + ["lookup", "forward"] * 2)
    plain, _ = plain_loop("table_wise", data, 1, local_env())
    assert all(torch.equal(a, b) for a, b in zip(losses, plain))


@pytest.mark.parametrize("pipeline_class", [TrainPipelineFusedSparseDist, PrefetchTrainPipelineSparseDist,
                                            partial(TrainPipelineSemiSync, start_batch=0)])
@pytest.mark.parametrize("pipeline_postproc", [True, False])
def test_a_collection_fed_a_computed_kjt(pipeline_class, pipeline_postproc):
    """pipeline_postproc=True (TorchRec's default in these three) would pipeline the modules that compute the KJT:
    refused on the first step; False: the collection keeps its input_dist (and SemiSync its lookup) in the forward,
    on the updated tables: the numbers are the plain loop's."""
    dmp, optimizer = build("table_wise", 1, local_env())

    def forward(batch):
        features = batch.sparse_features
        return dmp(batch._replace(sparse_features=features.permute(list(range(len(features.keys()))))))

    data = batches(0, 1, 4)
    pipeline = pipeline_class(dmp, optimizer, torch.device("cpu"), custom_model_fwd=forward,
                              pipeline_postproc=pipeline_postproc)
    feed = iter(data)
    if pipeline_postproc:
        with pytest.raises(NotImplementedError, match=r"\['model.sparse.ebc'\].*pipeline_postproc=False"):
            pipeline.progress(feed)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # build()'s CombinedOptimizer holds the fused tables: SemiSync warns
        losses = [pipeline.progress(feed) for _ in data]
    assert pipeline.pipelined_modules == []
    plain, _ = plain_loop("table_wise", data, 1, local_env())
    assert all(torch.equal(a, b) for a, b in zip(losses, plain))


def test_arguments_that_cannot_work_here_are_refused():
    dmp, optimizer = build("table_wise", 1, local_env())
    with pytest.raises(RuntimeError, match="emb_lookup_stream 'side'"):
        TrainPipelineFusedSparseDist(dmp, optimizer, torch.device("cpu"), emb_lookup_stream="side")
    with pytest.raises(NotImplementedError, match="emb_lookup_stream='data_dist'.*current stream"):
        TrainPipelineFusedSparseDist(dmp, optimizer, torch.device("cuda"))
    with pytest.raises(NotImplementedError, match="strict=True"):
        TrainPipelineFusedSparseDist(dmp, optimizer, torch.device("cpu"), strict=True)
    for name in ("apply_jit", "enqueue_batch_after_forward", "free_features_storage_early"):
        with pytest.raises(NotImplementedError, match=name):
            TrainPipelineFusedSparseDist(dmp, optimizer, torch.device("cpu"), **{name: True})
    for name in ("apply_jit", "enable_inplace_copy_batch", "clear_data_dist_inputs"):
        with pytest.raises(NotImplementedError, match=name):
            PrefetchTrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), **{name: True})
    for stream in ("new", "current", "data_dist"):  # on CPU there are no streams: the three are the same
        TrainPipelineFusedSparseDist(dmp, optimizer, torch.device("cpu"), emb_lookup_stream=stream)
