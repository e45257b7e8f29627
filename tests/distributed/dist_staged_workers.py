"""Workers of the StagedTrainPipeline tests: the plain loop's N steps through StagedTrainPipeline with
SparseDataDistUtil's stage last (importable by spawned processes)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from rectoolkit.distributed import full_state_dict
from rectoolkit.distributed.train_pipeline import PipelineStage, SparseDataDistUtil, StagedTrainPipeline
from dist_pipeline_workers import assert_identical, batches, build, count_own_input_dists, path_of, plain_loop


def staged(case: str, data: List, W: int, env=None, copy_stage: bool = True):
    """Train through StagedTrainPipeline([data_copy, sparse data dist]) (or the sdd stage alone); also how often a
    forward ran its own input_dist (on the groups that send ids) and what was pipelined."""
    dmp, optimizer = build(case, W, env)
    sync_calls, routed = count_own_input_dists(dmp, case)
    sdd = SparseDataDistUtil(dmp, data_dist_stream=None)
    stages = [PipelineStage("data_copy", lambda batch: batch.to(torch.device("cpu")), None)] if copy_stage else []
    pipeline = StagedTrainPipeline(stages + [sdd.start_sparse_data_dist_stage()])
    feed, losses = iter(data), []
    while (batch := pipeline.progress(feed)) is not None:
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    info = dict(modules=sdd.pipelined_modules, sync_input_dists=len(sync_calls), routed_groups=len(routed),
                after_end=pipeline.progress(feed))
    return losses, full_state_dict(dmp), info


def check_staged(rank: int, case: str, info: Dict) -> None:
    assert info["modules"] == [path_of(case)], f"rank {rank} {case}: pipelined {info['modules']}"
    assert info["sync_input_dists"] == info["routed_groups"], (
        f"rank {rank} {case}: forward ran its own input_dist {info['sync_input_dists']} times; only the first "
        f"step's {info['routed_groups']} groups should")
    assert info["after_end"] is None, f"rank {rank} {case}: progress() after the end gave {info['after_end']}"


def staged_worker(rank: int, W: int, runs: List[Tuple[str, bool]], steps: int) -> None:
    """For each (plan, whether a copy stage comes before the sparse data dist): the plain loop's losses and
    weights bit for bit, every batch handed out once, the collection pipelined."""
    for case, copy_stage in runs:
        data = batches(rank, W, steps, case)
        losses, state, info = staged(case, data, W, copy_stage=copy_stage)
        check_staged(rank, case, info)
        assert_identical(rank, f"{case} copy_stage={copy_stage}", plain_loop(case, data, W), (losses, state), steps)
