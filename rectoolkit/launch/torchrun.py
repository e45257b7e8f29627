"""The same worker context under `torchrun` (torch.distributed elastic) instead of `launch`.

`torchrun` sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT; this joins that
process group (`env://`) and returns a WorkerContext, so one training function serves both:

    ctx = torchrun_context(on_metrics=print)     # inside `torchrun --nproc-per-node 2 my_script.py`
    train(ctx, config)
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist

from rectoolkit.launch.affinity import CpuBinding, available_cpus, bind_this_process, rank_cpus
from rectoolkit.launch.context import WorkerContext
from rectoolkit.launch.job import default_backend


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(f"environment variable {name} is not set: run this under torchrun "
                           f"(e.g. `torchrun --standalone --nproc-per-node 2 -m rectoolkit.train ...`)")
    return int(value)


def torchrun_context(backend: Optional[str] = None, on_metrics: Optional[Callable[[Dict[str, Any]], None]] = None,
                     collective_timeout_s: float = 300.0, num_threads: Optional[int] = None,
                     cpu_binding: CpuBinding = "none") -> WorkerContext:
    """Join the torchrun process group (env://) and describe this process as a WorkerContext.

    `backend` defaults to nccl when this host has LOCAL_WORLD_SIZE GPUs, else gloo. `on_metrics` receives
    each `ctx.report(...)` dict (with "rank" added) in this process; without it reports go to `ctx.history`.
    `cpu_binding` as in `rectoolkit.launch.start`: "none" (default) leaves the process where it is; "auto" binds
    it to its local rank's share of the host's cores, as `launch` binds its workers, unless something placed it
    already (numactl, taskset: its affinity mask holds fewer than all the cores), which is then left as it is;
    or one list of cores per local rank.
    """
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    placed_already = len(available_cpus()) < (os.cpu_count() or 1)
    cpus = None if cpu_binding == "auto" and placed_already else rank_cpus(local_rank, local_world_size, cpu_binding)
    bind_this_process(cpus)  # before the process group starts its threads
    backend = backend or default_backend(local_world_size)
    torch.set_num_threads(num_threads or max(1, (os.cpu_count() or 1) // local_world_size))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=collective_timeout_s))
    send = None
    if on_metrics is not None:
        send = lambda metrics: on_metrics({"rank": rank, **metrics})  # noqa: E731
    return WorkerContext(rank=rank, world_size=world_size, local_rank=local_rank,
                         local_world_size=local_world_size, device=device, backend=backend, cpus=cpus, _send=send)
