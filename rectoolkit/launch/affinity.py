"""Which CPU cores each local rank runs on: `cpu_binding` of `launch`, `start`, `torchrun_context` and the calibration.

By default ("none") local ranks run wherever the scheduler puts them. With "auto" each local rank is bound to its
own share of the cores this process may use: with C cores and W local ranks, rank r gets cores [r k, (r + 1) k)
of them, k = C // W (the remainder stays with the last rank); when there are fewer cores than ranks nothing is
bound (the ranks would have to share cores anyway, and a fixed pairing would stop the scheduler from balancing
them). Or give one list of cores per local rank. The worker binds itself before torch.distributed starts, so
gloo's threads share their rank's cores.

Which is faster depends on the work, so binding is not the default. On the 2-core VM of benchmarks/RESULTS.md
(results/cpu_binding_2core.md and pipeline_bound_2core.md), bound ranks ran TrainPipelineSparseDist 1.09x and 1.19x the steps/s
(medians of two workloads), the table-wise plans of bench_cost_model in 0.89x and 0.97x the step time, but the
plans with the most collectives per step or one busy rank slower (issue8's "mixed" 1.14x, "rank0" 1.04-1.06x):
a bound rank's gloo threads then wait for its one core.

    >>> rank_cpus(1, 2, "auto", available=[0, 1, 2, 3, 4])
    [2, 3, 4]
    >>> rank_cpus(0, 4, "auto", available=[0, 1]) is None      # fewer cores than ranks: not bound
    True
    >>> rank_cpus(1, 2, [[0], [1]], available=[0, 1])          # explicit: one core list per rank
    [1]
    >>> rank_cpus(0, 2, "none", available=[0, 1]) is None
    True
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence, Union

CpuBinding = Union[None, str, Sequence[Sequence[int]]]
BINDING_MODES = ("auto", "none")


def available_cpus() -> List[int]:
    """The cores this process may run on (its affinity mask; all of them where the platform has no masks)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def can_bind() -> bool:
    """Whether this platform binds processes to cores (Linux does; macOS and Windows have no sched_setaffinity)."""
    return hasattr(os, "sched_setaffinity")


def rank_cpus(local_rank: int, local_world_size: int, binding: CpuBinding,
              available: Optional[Sequence[int]] = None) -> Optional[List[int]]:
    """The cores local rank `local_rank` of `local_world_size` binds to, or None (not bound).

    `binding`: "auto" (an even share of `available`, the cores this process may use, when every rank gets at
    least one; otherwise None), "none" or None (never bound), or one list of cores per local rank. Explicit lists
    are checked: one per rank, none empty, every core one this process may use."""
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local_rank must be in [0, {local_world_size}), got {local_rank}")
    cores = sorted(set(available if available is not None else available_cpus()))
    if binding is None or (isinstance(binding, str) and binding == "none"):
        return None
    if isinstance(binding, str):
        if binding != "auto":
            raise ValueError(f"cpu_binding must be one of {BINDING_MODES}, None, or one list of cores per local "
                             f"rank; got {binding!r}")
        if not can_bind() and available is None:
            return None
        share = len(cores) // local_world_size
        if share == 0:
            return None
        start = local_rank * share
        stop = len(cores) if local_rank == local_world_size - 1 else start + share
        return cores[start:stop]
    lists = list(binding)
    if len(lists) != local_world_size:
        raise ValueError(f"cpu_binding has {len(lists)} core lists but there are {local_world_size} local ranks: "
                         f"give one list of cores per rank, \"auto\" or \"none\"")
    chosen = sorted({int(core) for core in lists[local_rank]})
    if not chosen:
        raise ValueError(f"cpu_binding[{local_rank}] is empty: give local rank {local_rank} at least one core")
    outside = [core for core in chosen if core not in cores]
    if outside:
        raise ValueError(f"cpu_binding[{local_rank}] names core(s) {outside} that this process may not use "
                         f"(it may use {cores}); pick cores from those")
    if not can_bind():
        raise ValueError(f"cpu_binding {binding!r}: this platform cannot bind processes to cores "
                         f"(no os.sched_setaffinity); pass cpu_binding=\"none\"")
    return chosen


def all_rank_cpus(binding: CpuBinding, local_world_size: int) -> List[Optional[List[int]]]:
    """`rank_cpus` of every local rank, in order: call it in the caller's process, before anything is spawned, so
    that an invalid binding raises there."""
    return [rank_cpus(rank, local_world_size, binding) for rank in range(local_world_size)]


def bind_this_process(cpus: Optional[Sequence[int]]) -> None:
    """Bind the calling thread, and every thread it starts from now on, to `cpus` (None: leave it as it is).

    Call it first thing in a worker, before torch.distributed starts its threads: threads started earlier keep
    their own mask."""
    if cpus is not None:
        os.sched_setaffinity(0, set(cpus))
