"""One rank of the kill-during-save test (test_checkpoint_faults.py starts one process per rank at `logged_main`,
forked from the test harness's forkserver; by hand, as a script):

    python ckpt_kill_worker.py RANK WORLD_SIZE INIT_FILE CHECKPOINT_DIR KILL_AT OUT_FILE

Builds TinyModel (seed 0) under a mixed plan, saves checkpoint "version 1", adds 1 to every weight, then saves
"version 2" over it with a line tracer on the checkpoint code (rectoolkit/distributed/checkpoint*.py, agree.py and
torch.save's Python side). KILL_AT = 0: count the traced lines of the second save, write the counts to OUT_FILE
and exit 0. KILL_AT = n > 0: SIGKILL this process at the n-th traced line, wherever that is. KILL_AT = -1: run
untraced (the rank that is not the victim). The count (JSON) also gives the line at which rank 0 entered the
commit and the clean-up after it, so the test knows which version a kill must leave.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.serialization

import rectoolkit.distributed.agree
import rectoolkit.distributed.checkpoint
import rectoolkit.distributed.checkpoint_commit
import rectoolkit.distributed.checkpoint_format
import rectoolkit.distributed.checkpoint_resharding
from rectoolkit.distributed import DistributedModelParallel, save_checkpoint
from rectoolkit.plan.types import ShardingPlan
from dist_dmp_workers import PATH, TinyModel
from dist_harness import finish_worker
from dist_workers import bag_tables, plan_for

TRACED = {rectoolkit.distributed.checkpoint.__file__, rectoolkit.distributed.checkpoint_commit.__file__,
          rectoolkit.distributed.checkpoint_format.__file__, rectoolkit.distributed.checkpoint_resharding.__file__,
          rectoolkit.distributed.agree.__file__,
          torch.serialization.__file__}


MARKS = ("commit", "remove_stale")  # functions whose first call is recorded: the commit, the clean-up after it


def traced_lines(kill_at: int):
    """A sys.settrace tracer counting line events in TRACED files; SIGKILLs this process at line `kill_at`.
    Returns the tracer and the counts: "lines", and the line count when each of MARKS was first called."""
    counts = {"lines": 0}

    def local(frame, event, arg):
        if event == "line":
            counts["lines"] += 1
            if counts["lines"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return local

    def tracer(frame, event, arg):
        if frame.f_code.co_filename not in TRACED:
            return None
        if frame.f_code.co_name in MARKS:
            counts.setdefault(frame.f_code.co_name, counts["lines"])
        return local

    return tracer, counts


def bump(dmp) -> None:
    """Add 1 to every weight this rank holds (shards, replicas, dense parameters), each tensor once."""
    seen = set()
    with torch.no_grad():
        tensors = [w for c in dmp.sharded_modules.values() for _, _, w, _ in c.local_shards()]
        for tensor in tensors + list(dmp.module.parameters()):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                tensor += 1


def main(rank: int, world_size: int, init_file: str, checkpoint_dir: str, kill_at: int, out_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    plan = ShardingPlan({PATH: plan_for("mixed_a", bag_tables(), world_size, world_size)})
    dmp = DistributedModelParallel(TinyModel(), plan=plan, local_world_size=world_size)
    save_checkpoint(dmp, checkpoint_dir, extra={"version": 1})
    bump(dmp)
    dist.barrier()
    tracer, counts = traced_lines(kill_at)
    if kill_at >= 0:
        sys.settrace(tracer)
    save_checkpoint(dmp, checkpoint_dir, extra={"version": 2})
    sys.settrace(None)
    if kill_at == 0:
        with open(out_file, "w") as f:
            json.dump(counts, f)
    finish_worker()


def logged_main(log_file: str, *args) -> None:
    """main(*args) with this process's stdout and stderr (Python's and the C library's) going to log_file."""
    with open(log_file, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    main(*args)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
