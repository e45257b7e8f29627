"""Spawn W gloo workers for the multi-process tests: torch.multiprocessing + a file:// rendezvous.

Workers run with one thread each; an exception in any worker fails the test with that worker's traceback.
Also: hand-built plans (no planner needed) and deterministic per-rank batches.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from rectoolkit.sparse import KeyedJaggedTensor


# gloo workers fork from multiprocessing's forkserver, which imported these once, instead of each spawned worker
# importing them again (about 6 s of a 2-rank test on 2 cores). The server only imports: it runs no torch op, starts
# no thread and joins no process group, so every worker still starts clean.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "rectoolkit.distributed"]
mp.set_forkserver_preload(FORKSERVER_PRELOAD)


def _entry(rank: int, fn: Callable, world_size: int, init_file: str, args: tuple, backend: str = "gloo",
           environ: Optional[Dict[str, str]] = None) -> None:
    if environ is not None:  # the caller's environment now, not the forkserver's from when it started
        os.environ.clear()
        os.environ.update(environ)
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)  # NCCL: one GPU per rank
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=60))
    try:
        fn(rank, world_size, *args)
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_worker()


def finish_worker() -> None:
    """End a worker that succeeded: wait for every peer, tear gloo down, and leave without interpreter teardown.

    Leaving through os._exit skips Python's finalization, during which gloo's threads can abort the process
    ("terminate called without an active exception") after all the work is done.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_workers(fn: Callable, world_size: int, *args, backend: str = "gloo") -> None:
    """Run fn(rank, world_size, *args) on world_size spawned processes joined by gloo (or `backend`)."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        # NCCL workers are spawned: each sets its own CUDA device in a fresh process
        start_method = "spawn" if backend == "nccl" else "forkserver"
        mp.start_processes(_entry, args=(fn, world_size, init_file, args, backend, dict(os.environ)),
                           nprocs=world_size, join=True, start_method=start_method)


def run_side_by_side(fn: Callable, out_dir: str, world_size: int = 2) -> List[tuple]:
    """Run fn(rank, world_size, lib_name, out_dir) for "torchrec", then for "rectoolkit"; each rank writes what it
    saw to out_dir/<lib_name>_<rank>.json. Returns (TorchRec's, rectoolkit's) of each rank."""
    import json

    for lib_name in ("torchrec", "rectoolkit"):
        run_workers(fn, world_size, lib_name, out_dir)
    return [tuple(json.loads(open(os.path.join(out_dir, f"{lib_name}_{rank}.json")).read())
                  for lib_name in ("torchrec", "rectoolkit")) for rank in range(world_size)]


# ------------------------------------------------------------------------------------------------ plans
def table_wise(rank: int, rows: int, dim: int) -> ParameterSharding:
    return ParameterSharding("table_wise", ranks=[rank], shards=[ShardMetadata.on_rank(rank, 0, 0, rows, dim)])


def row_wise(ranks: Sequence[int], rows: int, dim: int, kind: str = "row_wise") -> ParameterSharding:
    block = -(-rows // len(ranks))
    shards = [ShardMetadata.on_rank(r, k * block, 0, max(0, min(block, rows - k * block)), dim) for k, r in enumerate(ranks)]
    return ParameterSharding(kind, ranks=list(ranks), shards=shards)


def column_wise(ranks_and_cols: Sequence[tuple], rows: int, kind: str = "column_wise") -> ParameterSharding:
    shards, start = [], 0
    for rank, cols in ranks_and_cols:
        shards.append(ShardMetadata.on_rank(rank, 0, start, rows, cols))
        start += cols
    return ParameterSharding(kind, ranks=[r for r, _ in ranks_and_cols], shards=shards)


def grid(blocks: Sequence[tuple], rows: int) -> ParameterSharding:
    """blocks: (host ranks, cols) per column block; each block row-wise over its ranks."""
    shards, start = [], 0
    for ranks, cols in blocks:
        shards += [ShardMetadata.on_rank(s.rank, s.shard_offsets[0], start, s.shard_sizes[0], cols)
                   for s in row_wise(ranks, rows, cols).shards]
        start += cols
    return ParameterSharding("grid_shard", ranks=sorted({s.rank for s in shards}), shards=shards)


def data_parallel(world_size: int, rows: int, dim: int) -> ParameterSharding:
    return ParameterSharding("data_parallel", ranks=list(range(world_size)),
                             shards=[ShardMetadata.on_rank(r, 0, 0, rows, dim) for r in range(world_size)])


# ------------------------------------------------------------------------------------------------ batches
def make_batch(features: Dict[str, int], batch_size: int, seed: int, weighted: bool = False,
               max_length: int = 4) -> KeyedJaggedTensor:
    """A KJT over `features` (name -> table rows) with random lengths 0..max_length-1 and ids."""
    g = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for rows in features.values():
        L = torch.randint(0, max_length, (batch_size,), generator=g)
        lengths.append(L)
        values.append(torch.randint(0, rows, (int(L.sum()),), generator=g))
    v = torch.cat(values)
    w = torch.rand(v.numel(), generator=g) if weighted else None
    return KeyedJaggedTensor.from_lengths_sync(keys=list(features), values=v, lengths=torch.cat(lengths), weights=w)


def global_batch(batches: List[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    """The per-rank batches as one batch of W * B samples (rank 0's samples first), per feature."""
    keys = batches[0].keys()
    lengths, values, weights = [], [], []
    for key in keys:
        for kjt in batches:
            jt = kjt[key]
            lengths.append(jt.lengths())
            values.append(jt.values())
            if kjt.weights_or_none() is not None:
                weights.append(jt.weights())
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths),
                                               weights=torch.cat(weights) if weights else None)


# ------------------------------------------------------------------------------------------------ TorchRec
def load_torchrec_shards(dmp, weights: Dict[str, torch.Tensor]) -> None:
    """Copy full tables into the local shards of TorchRec's DistributedModelParallel (sharded tables: each shard's
    slice; replicated DATA_PARALLEL tables: the whole table), so TorchRec and rectoolkit start from the same weights."""
    with torch.no_grad():
        for key, value in dmp.state_dict().items():
            table = key.split(".")[-2]
            if not hasattr(value, "local_shards"):
                value.copy_(weights[table])
                continue
            for shard in value.local_shards():
                (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(weights[table][r0:r0 + nr, c0:c0 + nc])


def run_cpu_shims() -> None:
    """TorchRec 1.8's semi-sync and fused pipelines record streams and ask torch.cuda for the current stream even on
    CPU; on a CPU-only torch those calls fail. On CPU they have nothing to do (one stream, no copies): make them
    no-ops (in a spawned worker: they change torch for the whole process)."""
    torch.Tensor.record_stream = lambda self, stream: None
    torch.cuda.current_stream = lambda device=None: torch.cpu.current_stream()
