"""Measure this machine's cost-model terms and save them as a CalibrationProfile (JSON).

    python -m rectoolkit.planner.calibrate --world-size 2      # then Topology(..., profile="default")

Short micro-benchmarks of rectoolkit's own kernels and collectives run on `world_size` spawned local workers (gloo
on CPU, NCCL on CUDA), one torch thread per rank, and each term is fitted from the fastest of several repeats (a
busy machine slows some repeats, rarely all, so the minimum moves little with load):

1. collectives: all_to_all_single, all_reduce, reduce_scatter and all_gather (list forms, which gloo runs) at five
   message sizes each, every call timed interleaved with the others on the wall clock (the slowest rank's, fastest
   of twice the repeats) -> one alpha-beta pair per collective, fitted alike (`fit_alpha_beta`): alpha = the
   smallest message's time (ms per call), bytes/ms = the least-squares slope above it, bytes being what one rank
   sends plus receives (a reduce-scatter or an all-gather of a B-byte buffer: 2 (W-1)/W x B, an all-reduce twice
   that). Which pair prices which of the engine's collectives: rectoolkit.planner.cost.FITTED_COLLECTIVE;
2. lookups: one table's pooled lookup (uniform ids) at four table sizes, from 256 KiB (in cache) to 128 MiB (in
   memory), each at two row widths and two batch sizes -> the read speed curve (ms per row byte), the cost per id
   and per output byte, every one a slope, so the call's fixed part is left out; the same timings of the backward
   + fused update at 16 MiB -> its terms for SGD, scaled for the other optimizers by their measured extra time; a
   16 MiB read on every rank at once -> how much local ranks share the memory bus; a large copy -> the write speed;
3. fixed costs: the sharded EmbeddingBagCollection itself on tiny tables (table-wise alone, four table-wise,
   each sharding type beside a table-wise one) -> ms per step and per sharding-type group; one and four small
   tables under a full batch, table-wise, replicated and row-wise -> ms per shard, per data-parallel replica
   and per row-routed shard; a 16 MiB table of 64-wide rows, table-wise and row-wise, at 2, 5, 10 and 20 ids
   per bag on two collections built apart -> the engine's work per id beyond what 2. prices (the least-squares
   slope through all eight steps: one built collection can sit 10-20% off another), row-block routing per id;
   the same table under a heavy batch, on rank 0 and one per rank -> how well local ranks run at once;
4. on gloo, rectoolkit.planner.load's synthetic step -> the machine's load factor while it calibrated
   (`machine["load_probe"]`, a record: the terms above are fastest repeats and CPU times, which load moves little).

From a script, call it under `if __name__ == "__main__":` (the workers are spawned and re-import the script).

    >>> from rectoolkit.planner.profile import CalibrationProfile
    >>> isinstance(calibrate_profile.__doc__, str)
    True
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import multiprocessing
import os
import platform
import queue as queue_module
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from rectoolkit.planner.load import measure_load
from rectoolkit.planner.profile import (COLLECTIVE_KINDS, SHARDING_TYPES, AlphaBeta, CalibrationProfile, LookupTerms,
                                        default_profile_path, fit_alpha_beta)

A2A_PEER_BYTES = (64, 4 << 10, 64 << 10, 512 << 10, 2 << 20)  # bytes to each peer
BUFFER_BYTES = (256, 16 << 10, 256 << 10, 2 << 20, 8 << 20)  # the whole buffer of all_reduce, reduce_scatter, all_gather
READ_TABLE_BYTES = (256 << 10, 2 << 20, 16 << 20, 128 << 20)
READ_DIM = 64
READ_BATCH, READ_POOLING = 512, 20  # the engine's full batch: bags per rank, ids per bag
LIGHT_POOLING = 2  # the engine's light batch: the full one less this is the per-id slope
HEAVY_POOLING = 100  # the engine's heavy batch: enough work that local ranks' sharing stands out of the noise
# the engine's slope per id: a line through its step at these ids per bag, on collections built apart (one built
# collection's step can sit 10-20% off another's, more than the slope's whole rise over two points)
ENGINE_POOLINGS = (LIGHT_POOLING, 5, 10, READ_POOLING)
ENGINE_INSTANCES = 2
LOOKUP_DIMS = (16, 128)  # two row widths: their difference is the per-byte cost, the narrow one's rest per id
LOOKUP_SAMPLES, LOOKUP_IDS_PER_BAG = 1024, (1, 32)  # two batches of as many bags: their difference is per id
MIN_MS_PER_BYTE = 1e-9  # 1000 GB/s: a slope below this is noise
OPTIMIZERS = ("sgd", "adagrad", "row_wise_adagrad", "adam")
ZIPF_ALPHA = 0.0  # uniform ids: a shard's working set is all of it (skewed ids would make big tables look cached)


class CalibrationError(RuntimeError):
    """Calibration could not run; the message says why and what to do."""


# ------------------------------------------------------------------------------------------------ timing
_ON_CUDA = False  # set in each worker: whether this calibration measures the GPU (compute_device "cuda")


def _clock() -> Callable[[], float]:
    """Compute is timed in this thread's CPU time on CPU (other processes' load does not stretch it), wall on CUDA."""
    return time.perf_counter if _ON_CUDA else time.thread_time


def fastest_ms(fn: Callable[[], object], repeats: int, clock: Optional[Callable[[], float]] = None) -> float:
    """The fastest of `repeats` timed calls of fn, in ms (one untimed call first)."""
    clock = clock or _clock()
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        if _ON_CUDA:
            torch.cuda.synchronize()
        best = min(best, (clock() - start) * 1000.0)
    return best


def fastest_each(calls: Mapping[Hashable, Callable[[], object]], repeats: int,
                 clock: Optional[Callable[[], float]] = None, synced: bool = False) -> Dict[Hashable, float]:
    """The fastest of `repeats` timed calls of each function, in ms, the calls interleaved round by round: a burst
    of load on the machine then slows one round of every call rather than every repeat of a few, which would move
    the terms fitted from their differences. One untimed call of each first. `synced`: every rank makes the calls
    together and each time is the slowest rank's (barrier before, all-reduce of the max after)."""
    return {key: min(times) for key, times in timed_each(calls, repeats, clock, synced).items()}


def timed_each(calls: Mapping[Hashable, Callable[[], object]], repeats: int,
               clock: Optional[Callable[[], float]] = None, synced: bool = False) -> Dict[Hashable, List[float]]:
    """Every timed call of fastest_each, in ms: key -> one time per round."""
    clock = clock or _clock()
    for fn in calls.values():
        fn()
    best: Dict[Hashable, List[float]] = {key: [] for key in calls}
    slowest = torch.zeros(1, dtype=torch.float64, device=_device()) if synced else None
    for _ in range(repeats):
        for key, fn in calls.items():
            if synced:
                dist.barrier()
            start = clock()
            fn()
            if _ON_CUDA:
                torch.cuda.synchronize()
            elapsed = (clock() - start) * 1000.0
            if synced:
                slowest[0] = elapsed
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                elapsed = float(slowest[0])
            best[key].append(elapsed)
    return best


def _device() -> torch.device:
    """The compute device being calibrated: a CPU calibration on a machine with a GPU stays on the CPU."""
    if _ON_CUDA:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------------ the parts
def measure_collectives(world_size: int, repeats: int) -> Dict[str, List[Tuple[float, float]]]:
    """(bytes one rank sends + receives, fastest ms) per collective kind (COLLECTIVE_KINDS) and message size: wall
    clock (a collective's time is waiting too), all sizes and kinds interleaved, twice the repeats (the smallest
    message's fastest repeat is the latency, which a loaded machine's scheduling delays hide in most repeats)."""
    calls, sizes = {}, {}
    for peer_bytes in A2A_PEER_BYTES:
        send = torch.ones(world_size * peer_bytes // 4, device=_device())
        calls[("all_to_all", peer_bytes)] = functools.partial(dist.all_to_all_single, torch.empty_like(send), send)
        sizes[("all_to_all", peer_bytes)] = 2.0 * (world_size - 1) * peer_bytes
    for total in BUFFER_BYTES:
        for kind in ("all_reduce", "reduce_scatter", "all_gather"):
            calls[(kind, total)], sizes[(kind, total)] = _buffer_collective(kind, total, world_size)
    best = fastest_each(calls, 2 * repeats, clock=time.perf_counter, synced=True)
    samples: Dict[str, List[Tuple[float, float]]] = {kind: [] for kind in COLLECTIVE_KINDS}
    for key, ms in best.items():
        samples[key[0]].append((sizes[key], ms))
    return samples


def _buffer_collective(kind: str, total_bytes: int, world_size: int) -> Tuple[Callable[[], object], float]:
    """(the call, bytes one rank sends + receives in it) of one collective over a float32 buffer of about
    `total_bytes` (world_size equal chunks). Counted as a ring moves them: a reduce-scatter and an all-gather each
    send and receive (W - 1) / W of the buffer, an all-reduce (one of each) twice that.

    >>> _buffer_collective("reduce_scatter", 1024, 2)[1]
    1024.0
    """
    chunk = max(total_bytes // (4 * world_size), 1)  # values per rank
    buffer_bytes = 4.0 * chunk * world_size
    ring_bytes = 2.0 * (world_size - 1) / world_size * buffer_bytes
    if kind == "all_reduce":
        return functools.partial(dist.all_reduce, torch.ones(chunk * world_size, device=_device())), 2.0 * ring_bytes
    parts = [torch.ones(chunk, device=_device()) for _ in range(world_size)]
    mine = torch.empty(chunk, device=_device())
    if kind == "reduce_scatter":
        return functools.partial(dist.reduce_scatter, mine, parts), ring_bytes
    if kind == "all_gather":
        return functools.partial(dist.all_gather, parts, mine.fill_(1.0)), ring_bytes
    raise ValueError(f"_buffer_collective: kind must be all_reduce, reduce_scatter or all_gather, got {kind!r}")


def _lookup_module(rows: int, dim: int, optimizer: Optional[str]):
    from rectoolkit.modules.configs import EmbeddingBagConfig
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection

    config = EmbeddingBagConfig(name="t", num_embeddings=rows, embedding_dim=dim, feature_names=["f"])
    if optimizer is None:
        return EmbeddingBagCollection([config], device=_device())
    return EmbeddingBagCollection([config], device=_device(), optimizer=optimizer, lr=1e-6)


def _lookup_batch(rows: int, seed: int, batch_size: int = READ_BATCH, pooling: int = READ_POOLING):
    from rectoolkit.sparse import KeyedJaggedTensor
    from rectoolkit.train.data import zipf_ids

    generator = torch.Generator().manual_seed(seed)
    ids = zipf_ids(batch_size * pooling, rows, ZIPF_ALPHA, generator)
    lengths = torch.full((batch_size,), pooling, dtype=torch.int32)
    return KeyedJaggedTensor.from_lengths_sync(["f"], ids.to(_device()), lengths.to(_device()))


def _slopes(times: Dict[Tuple[int, int], float], read_ms_per_byte: Optional[float] = None) -> Tuple[float, float, float]:
    """(ms per id, ms per row byte, ms per output byte) from one pass timed at LOOKUP_DIMS x (small, large) batches
    of LOOKUP_SAMPLES bags: each difference of two batches leaves the call's fixed part out. With
    `read_ms_per_byte` (the backward), the per-row-byte slope is returned as a multiple of it (read_factor).

    >>> t = {(16, 1): 1.0 + 1024 * (1e-5 + 64e-6) + 1024 * 64 * 1e-7, (16, 32): 1.0 + 32768 * (1e-5 + 64e-6) + 1024 * 64 * 1e-7,
    ...      (128, 1): 1.0 + 1024 * (1e-5 + 512e-6) + 1024 * 512 * 1e-7, (128, 32): 1.0 + 32768 * (1e-5 + 512e-6) + 1024 * 512 * 1e-7}
    >>> [round(x, 9) for x in _slopes(t)]
    [1e-05, 1e-06, 1e-07]
    """
    small, large = LOOKUP_IDS_PER_BAG
    extra_ids = (large - small) * LOOKUP_SAMPLES
    low, high = LOOKUP_DIMS
    per_id = {d: (times[(d, large)] - times[(d, small)]) / extra_ids for d in LOOKUP_DIMS}
    extra_row_bytes = 4.0 * (high - low)
    per_byte = max((per_id[high] - per_id[low]) / extra_row_bytes, 0.0)
    id_ms = max(per_id[low] - 4.0 * low * per_byte, 0.0)
    small_ids = small * LOOKUP_SAMPLES
    output_ms = (times[(high, small)] - times[(low, small)] - small_ids * extra_row_bytes * per_byte)
    output_ms_per_byte = max(output_ms / (LOOKUP_SAMPLES * extra_row_bytes), 0.0)
    if read_ms_per_byte is not None:
        return id_ms, per_byte / read_ms_per_byte, output_ms_per_byte
    return id_ms, per_byte, output_ms_per_byte


def monotone_curve(curve: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The read curve with no table reading slower than a larger one (a small table's slope is the noisiest: its
    reads cost least), from the largest size down.

    >>> monotone_curve([(1.0, 50.0), (2.0, 80.0), (3.0, 20.0)])
    [(1.0, 80.0), (2.0, 80.0), (3.0, 20.0)]
    """
    points, fastest = [], 0.0
    for size, bytes_per_ms in sorted(curve, reverse=True):
        fastest = max(fastest, bytes_per_ms)
        points.append((size, fastest))
    return sorted(points)


def _pass_times(table_sizes: Sequence[int], optimizers: Sequence[Optional[str]],
                repeats: int) -> Dict[tuple, float]:
    """Fastest forward (optimizer None) or backward + update time of one table of each size in `table_sizes` at
    each (dim, ids per bag) of LOOKUP_DIMS x LOOKUP_IDS_PER_BAG, keyed (optimizer, size, dim, ids per bag), all
    timed interleaved; the backward is (forward + backward) - forward."""
    modules, batches, calls = {}, {}, {}
    for optimizer in optimizers:
        for table_bytes in table_sizes:
            for dim in LOOKUP_DIMS:
                rows = table_bytes // (dim * 4)
                module = modules[(optimizer, table_bytes, dim)] = _lookup_module(rows, dim, optimizer)
                for per_bag in LOOKUP_IDS_PER_BAG:
                    batch = batches[(rows, per_bag)] = batches.get((rows, per_bag)) or _lookup_batch(
                        rows, seed=per_bag, batch_size=LOOKUP_SAMPLES, pooling=per_bag)
                    key = (optimizer, table_bytes, dim, per_bag)
                    calls[key + ("forward",)] = _no_grad_call(module, batch)
                    if optimizer is not None:
                        calls[key + ("both",)] = _backward_call(module, batch)
    best = fastest_each(calls, repeats)
    times = {}
    for key in {k[:4] for k in calls}:
        forward_ms = best[key + ("forward",)]
        times[key] = forward_ms if key[0] is None else best[key + ("both",)] - forward_ms
    return times


def _no_grad_call(module, batch) -> Callable[[], object]:
    def call():
        with torch.no_grad():
            return module(batch)
    return call


def _backward_call(module, batch) -> Callable[[], object]:
    return lambda: module(batch).values().sum().backward()


def _at(times: Dict[tuple, float], optimizer: Optional[str], table_bytes: int) -> Dict[Tuple[int, int], float]:
    """The (dim, ids per bag) -> ms timings of one optimizer and table size (what _slopes reads)."""
    return {(dim, per_bag): ms for (o, size, dim, per_bag), ms in times.items() if o == optimizer and size == table_bytes}


def measure_lookups(rank: int, world_size: int, repeats: int) -> Dict[str, object]:
    """Rank 0 alone (the others wait): the forward's read speed by table size, its per-id and per-output-byte costs,
    and the backward + update's terms per optimizer (SGD's measured at 16 MiB, the others' as SGD's scaled by their
    extra time over the same batches); a large copy's speed."""
    result: Dict[str, object] = {}
    if rank == 0:
        middle = READ_TABLE_BYTES[2]
        times = _pass_times(READ_TABLE_BYTES, [None], repeats)
        times.update(_pass_times([middle], OPTIMIZERS, repeats))
        curve, id_costs, output_costs = [], [], []
        for table_bytes in READ_TABLE_BYTES:
            id_ms, per_byte, output_ms = _slopes(_at(times, None, table_bytes))
            curve.append((float(table_bytes), 1.0 / max(per_byte, MIN_MS_PER_BYTE)))
            id_costs.append(id_ms)
            output_costs.append(output_ms)
        curve = monotone_curve(curve)
        middle_per_byte = 1.0 / dict(curve)[float(middle)]
        sgd = _slopes(_at(times, "sgd", middle), middle_per_byte)
        backward = {"sgd": sgd}
        small, large = LOOKUP_IDS_PER_BAG
        dim = LOOKUP_DIMS[1]
        sgd_extra = (large - small) * LOOKUP_SAMPLES * (sgd[0] + 4.0 * dim * sgd[1] * middle_per_byte)
        for optimizer in OPTIMIZERS[1:]:
            extra = times[(optimizer, middle, dim, large)] - times[(optimizer, middle, dim, small)]
            scale = max(extra, 0.0) / max(sgd_extra, 1e-9)
            backward[optimizer] = tuple(x * scale for x in sgd)
        copy_source = torch.ones(16 << 20 >> 2, device=_device())
        copy_target = torch.empty_like(copy_source)
        copy_ms = fastest_ms(lambda: copy_target.copy_(copy_source), repeats)
        result.update(read_curve=curve, forward=(float(np.median(id_costs)), 1.0, float(np.median(output_costs))),
                      backward=backward, write_bytes_per_ms=2.0 * copy_source.numel() * 4 / copy_ms)  # read + write
    dist.barrier()
    return result


def _fixed_cost_plans(world_size: int) -> Dict[str, dict]:
    """Tiny-table plans whose step times give the fixed costs: name -> {table name: sharding type}."""
    plans = {"tw": {"a": "table_wise"}, "tw4": {"a": "table_wise", "b": "table_wise", "c": "table_wise",
                                                 "d": "table_wise"}}
    for kind in SHARDING_TYPES:
        if kind == "grid_shard" or (kind == "table_row_wise" and world_size < 2):
            continue
        plans[kind] = {"b": kind}
        plans["tw+" + kind] = {"a": "table_wise", "b": kind}
    return plans


def _tiny_parameter_sharding(kind: str, rows: int, dim: int, world_size: int):
    ranks = list(range(world_size))
    if kind == "table_wise":
        return ParameterSharding(kind, ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, rows, dim)])
    if kind == "data_parallel":
        return ParameterSharding(kind, ranks=ranks, shards=[ShardMetadata.on_rank(r, 0, 0, rows, dim) for r in ranks])
    if kind == "column_wise":
        cols = dim // world_size
        return ParameterSharding(kind, ranks=ranks,
                                 shards=[ShardMetadata.on_rank(r, 0, r * cols, rows, cols) for r in ranks])
    block = rows // world_size  # row_wise, table_row_wise (one host)
    return ParameterSharding(kind, ranks=ranks,
                             shards=[ShardMetadata.on_rank(r, r * block, 0, block, dim) for r in ranks])


def _sharded_step(env, plan: Dict[str, object], rows: int, dim: int, ids: torch.Tensor, lengths: torch.Tensor):
    """One training step (forward + backward + fused SGD) of a sharded collection of `plan`'s tables (`rows` x
    `dim` each), every table's feature given the same ids and lengths."""
    return _step_call(_sharded_collection(env, plan, rows, dim), plan, ids, lengths)


def _sharded_collection(env, plan: Dict[str, object], rows: int, dim: int):
    """A sharded collection of `plan`'s tables (`rows` x `dim` each, fused SGD)."""
    from rectoolkit.distributed.sharded_ebc import shard_embedding_bag_collection
    from rectoolkit.modules.configs import EmbeddingBagConfig
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection

    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=t, num_embeddings=rows, embedding_dim=dim,
                                                     feature_names=[f"f_{t}"]) for t in plan],
                                 device=_device(), optimizer="sgd", lr=1e-6)
    return shard_embedding_bag_collection(ebc, plan, env)


def _step_call(sharded, plan: Dict[str, object], ids: torch.Tensor, lengths: torch.Tensor):
    """A training step of `sharded` on these ids and lengths for every table's feature."""
    from rectoolkit.sparse import KeyedJaggedTensor

    kjt = KeyedJaggedTensor.from_lengths_sync([f"f_{t}" for t in plan], ids.repeat(len(plan)).to(_device()),
                                              lengths.repeat(len(plan)).to(_device()))
    return lambda: sharded(kjt).values().sum().backward()


def measure_fixed_costs(rank: int, world_size: int, repeats: int) -> Dict[str, float]:
    """Fastest step (sharded EBC forward + backward + fused SGD) of each plan below, slowest rank, in ms (this
    thread's CPU time: the groups' Python and kernel work; their collectives' latency is priced by alpha), all
    timed interleaved (fastest_each)."""
    from rectoolkit.distributed.comm import ShardingEnv

    env = ShardingEnv.from_process_group(local_world_size=world_size, device=_device())
    calls = {}
    # tiny tables, 8 bags of one id: the fixed costs per step and per sharding-type group
    rows, dim, bags = 64, 8 * world_size, 8
    for name, kinds in _fixed_cost_plans(world_size).items():
        plan = {t: _tiny_parameter_sharding(kind, rows, dim, world_size) for t, kind in kinds.items()}
        calls[name] = _sharded_step(env, plan, rows, dim, torch.arange(bags) % rows,
                                    torch.ones(bags, dtype=torch.int32))
    # per shard under a full batch (one id per bag): one and four small tables, table-wise on rank 0 and replicated
    for kind, label in (("table_wise", "tw"), ("data_parallel", "dp"), ("row_wise", "rw")):
        for count in (1, 4):
            plan = {f"s{i}": _tiny_parameter_sharding(kind, rows, READ_DIM, world_size) for i in range(count)}
            calls[f"{label}{count}_batch"] = _sharded_step(env, plan, rows, READ_DIM, torch.arange(READ_BATCH) % rows,
                                                           torch.ones(READ_BATCH, dtype=torch.int32))
    # the engine under real batches: a 16 MiB table table-wise on rank 0 ("tw"), then row-wise ("rw": row-block
    # routing), at ENGINE_POOLINGS ids per bag on ENGINE_INSTANCES collections built apart, each with its own ids
    # ("tw_p20_1": 20 ids per bag, the second collection); the rise per id is the engine's slope (engine_slope)
    rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    plans = {"tw": {"t0": _tiny_parameter_sharding("table_wise", rows, READ_DIM, 1)},
             "rw": {"t0": _tiny_parameter_sharding("row_wise", rows, READ_DIM, env.world_size)}}
    for name, plan in plans.items():
        for instance in range(ENGINE_INSTANCES):
            sharded = _sharded_collection(env, plan, rows, READ_DIM)
            for pooling in ENGINE_POOLINGS:
                batch = _lookup_batch(rows, seed=rank + 1000 * instance, pooling=pooling)
                calls[f"{name}_p{pooling}_{instance}"] = _step_call(sharded, plan, batch.values(), batch.lengths())
    # a heavy batch on rank 0's table, then on one such table on each rank (local ranks sharing a host)
    each = {f"t{r}": ParameterSharding("table_wise", ranks=[r], shards=[ShardMetadata.on_rank(r, 0, 0, rows, READ_DIM)])
            for r in range(env.world_size)}
    for name, plan in (("tw", plans["tw"]), ("tw_each", each)):
        batch = _lookup_batch(rows, seed=rank, pooling=HEAVY_POOLING)
        calls[f"{name}_heavy"] = _sharded_step(env, plan, rows, READ_DIM, batch.values(), batch.lengths())
    times = timed_each(calls, repeats, synced=True)
    return {key: min(t) for key, t in times.items()}, {key: float(np.median(t)) for key, t in times.items()}


def fixed_terms(step_ms: Dict[str, float], world_size: int) -> Tuple[float, float, Dict[str, float]]:
    """(ms per step, ms per shard, ms per sharding-type group) from the tiny plans' step times.

    tw = step + g_tw + s; tw4 = step + g_tw + 4 s; X = step + g_X + s; tw+X = step + g_tw + g_X + (1 + s_X) s on
    rank 0 (s_X: X's shards on rank 0, one for every type here) -> s, g_tw from tw+row_wise, then each g_X.

    >>> fixed_terms({"tw": 3.0, "tw4": 6.0, "row_wise": 4.0, "tw+row_wise": 6.0}, 2)
    (1.0, 1.0, {'table_wise': 1.0, 'row_wise': 2.0})
    """
    shard = max((step_ms["tw4"] - step_ms["tw"]) / 3.0, 0.0)
    group = {"table_wise": max(step_ms["tw+row_wise"] - step_ms["row_wise"] - shard, 0.0)}
    step = max(step_ms["tw"] - group["table_wise"] - shard, 0.0)
    for kind in SHARDING_TYPES:
        if kind == "table_wise" or "tw+" + kind not in step_ms:
            continue
        group[kind] = max(step_ms["tw+" + kind] - step_ms["tw"] - shard, 0.0)
    if "table_row_wise" in group:
        group.setdefault("grid_shard", group["table_row_wise"])  # a grid group runs table-row-wise's code
    return round(step, 4), round(shard, 4), {k: round(v, 4) for k, v in group.items()}


# ------------------------------------------------------------------------------------------------ workers
def _worker(rank: int, world_size: int, init_file: str, backend: str, compute_device: str, repeats: int,
            threads: int, results) -> None:
    global _ON_CUDA
    try:
        _ON_CUDA = compute_device == "cuda"
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        collectives = measure_collectives(world_size, repeats)
        reads = measure_lookups(rank, world_size, repeats)
        fixed, fixed_median = measure_fixed_costs(rank, world_size, repeats)
        # the load factor while calibrating, for the record (rectoolkit.planner.load; CPU tensors: gloo)
        probe = measure_load().to_dict() if backend == "gloo" else None
        if rank == 0:
            results.put(("ok", dict(collectives=collectives, reads=reads, fixed=fixed, fixed_median=fixed_median,
                                    load_probe=probe)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results.put(("error", f"rank {rank}:\n{traceback.format_exc()}"))
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # leave without interpreter teardown, where gloo's threads can abort a finished process


def _refuse_in_spawned_child() -> None:
    if multiprocessing.parent_process() is not None and getattr(multiprocessing.current_process(), "_inheriting", False):
        raise CalibrationError(
            "rectoolkit calibration was started while a spawned worker re-imported your script: call "
            "Topology.calibrate() / calibrate_profile() under `if __name__ == \"__main__\":` in a script")


def calibrate_profile(world_size: int = 2, compute_device: str = "cpu", repeats: Optional[int] = None,
                      quick: bool = False, threads: int = 1, timeout_s: float = 600.0) -> CalibrationProfile:
    """Run the micro-benchmarks on `world_size` local workers and fit a CalibrationProfile (module docstring)."""
    _refuse_in_spawned_child()
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"calibrate: world_size must be an int >= 2 (collectives need two ranks), got {world_size!r}")
    if compute_device not in ("cpu", "cuda"):
        raise ValueError(f"calibrate: compute_device must be 'cpu' or 'cuda', got {compute_device!r}")
    if compute_device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("calibrate: compute_device='cuda' but torch sees no CUDA device")
    backend = "nccl" if compute_device == "cuda" and torch.cuda.device_count() >= world_size else "gloo"
    repeats = repeats if repeats is not None else (5 if quick else 15)
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [context.Process(target=_worker, args=(r, world_size, init_file, backend, compute_device, repeats, threads,
                                                             results),
                                 daemon=True) for r in range(world_size)]
        for proc in procs:
            proc.start()
        try:
            status, payload = _wait_for_result(procs, results, timeout_s)
        finally:
            for proc in procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()
    if status != "ok":
        raise CalibrationError(f"calibration failed on {payload}")
    return _fit(payload, world_size, backend, compute_device, threads, repeats, time.time() - started)


def _wait_for_result(procs, results, timeout_s: float):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue_module.Empty:
            pass
        dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead:
            rank, code = dead[0]
            try:
                return results.get(timeout=2.0)
            except queue_module.Empty:
                pass
            raise CalibrationError(
                f"calibration worker rank {rank} exited with code {code} before reporting. From a script, call "
                "Topology.calibrate() under `if __name__ == \"__main__\":` (spawned workers re-import the script); "
                "otherwise see the worker's output above")
    raise CalibrationError(f"calibration did not finish within {timeout_s:.0f} s (machine overloaded or a worker "
                           "hung); retry with quick=True or a larger timeout_s")


def _engine_lookups_ms(profile: CalibrationProfile, ids: float, samples: float) -> float:
    """What `profile`'s lookup terms (forward + SGD backward) price for `ids` into the 16 MiB table."""
    row_bytes = READ_DIM * 4
    per_byte = profile.read_ms_per_byte(float(READ_TABLE_BYTES[2]))
    return sum(terms.cost_ms(ids, row_bytes, per_byte, samples * row_bytes)
               for terms in (profile.forward, profile.backward("sgd")))


def engine_slope(step_ms: Mapping[str, float], name: str, ids_per_bag: Callable[[int], float],
                 profile: CalibrationProfile) -> float:
    """ms per id of the engine's `name` steps ("tw" or "rw") beyond what the profile's lookup terms price: the
    least-squares slope of (step - lookups) over the ids a rank looks up, through every ENGINE_POOLINGS x
    ENGINE_INSTANCES step measured (keys "<name>_p<ids per bag>_<instance>"). `ids_per_bag(p)`: the ids the
    slowest rank looks up at p ids per bag.

    >>> from rectoolkit.planner.profile import AlphaBeta
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e9),), 1e6)
    >>> steps = {"tw_p2_0": 3.0, "tw_p20_0": 5.1, "tw_p2_1": 3.2, "tw_p20_1": 4.9}  # 1.9 ms more for 1800 more ids
    >>> round(engine_slope(steps, "tw", lambda pooling: 100.0 * pooling, p), 7)  # less the lookups' 7.7e-7 per id
    0.0010548
    """
    points = [(ids_per_bag(int(key.split("_p")[1].split("_")[0])), ms) for key, ms in step_ms.items()
              if key.startswith(f"{name}_p")]
    if len({ids for ids, _ in points}) < 2:
        raise ValueError(f"calibration: the engine's {name!r} steps need two batch sizes at least, got "
                         f"{sorted(k for k in step_ms if k.startswith(name + '_p'))}")
    ids = np.array([i for i, _ in points])
    rest = np.array([ms - _engine_lookups_ms(profile, i, 0.0) for i, ms in points])
    return float(np.polyfit(ids, rest, 1)[0])


def id_term(step_ms: Mapping[str, float], world_size: int, profile: CalibrationProfile) -> float:
    """ms per id a shard receives (forward + backward) that the lookup terms leave out: the slope of the table-wise
    16 MiB table's step over its ids per bag (engine_slope; rank 0 receives every rank's bags) is the engine's own
    work per id (checks, offsets, gradient rows), for rows READ_DIM floats wide: the cost model prices it in
    proportion to a shard's row bytes (CalibrationProfile.id_cost_ms).

    >>> from rectoolkit.planner.profile import AlphaBeta, LookupTerms
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e9),), 1e6,
    ...                        forward=LookupTerms(0.0, 1.0, 0.0), backward_terms={"sgd": LookupTerms(0.0, 1.0, 0.0)})
    >>> round(id_term({"tw_p20_0": 20.0, "tw_p2_0": 2.0}, 2, p), 7)
    0.0009761
    """
    return max(engine_slope(step_ms, "tw", lambda pooling: world_size * READ_BATCH * pooling, profile), 0.0)


def routing_id_term(step_ms: Mapping[str, float], world_size: int, profile: CalibrationProfile) -> float:
    """ms per id that row-block routing (row-wise, table-row-wise, grid) adds per id a shard receives: the same
    slope row-wise, where each rank receives 1/world_size of the ids and looks them up, less the engine's per-id
    work.

    >>> from rectoolkit.planner.profile import AlphaBeta, LookupTerms
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e9),), 1e6)
    >>> round(routing_id_term({"rw_p20_0": 12.0, "rw_p2_0": 2.0}, 2, p), 8)
    0.0010843
    """
    return max(engine_slope(step_ms, "rw", lambda pooling: READ_BATCH * pooling, profile) - profile.id_ms, 0.0)


def shard_terms(step_ms: Dict[str, float], world_size: int, profile: CalibrationProfile) -> Tuple[float, float, float]:
    """(ms per table-wise shard, per data-parallel replica, per row-routed shard) under a full batch: four small
    tables against one, per table, less what the lookup terms and the engine's per-id work price for its ids (a
    table-wise shard receives every rank's bags, a replica its own rank's, a row-wise shard every rank's bags and its
    row block's share of their ids, plus the routing per id).

    >>> from rectoolkit.planner.profile import AlphaBeta, LookupTerms
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e12),), 1e6,
    ...                        forward=LookupTerms(0.0, 1.0, 0.0), backward_terms={"sgd": LookupTerms(0.0, 0.0, 0.0)})
    >>> shard_terms({"tw1_batch": 2.0, "tw4_batch": 5.0, "dp1_batch": 1.0, "dp4_batch": 7.0, "rw1_batch": 1.0,
    ...              "rw4_batch": 10.0}, 2, p)
    (1.0, 2.0, 3.0)
    """
    result = []
    for label, ids, bags, per_id in (("tw", world_size * READ_BATCH, world_size * READ_BATCH, profile.id_ms),
                                     ("dp", READ_BATCH, READ_BATCH, profile.id_ms),
                                     ("rw", READ_BATCH, world_size * READ_BATCH, profile.id_ms + profile.routing_id_ms)):
        per_table = (step_ms[f"{label}4_batch"] - step_ms[f"{label}1_batch"]) / 3.0
        lookups = _engine_lookups_ms(profile, ids, bags) + ids * per_id
        result.append(round(max(per_table - lookups, 0.0), 4))
    return result[0], result[1], result[2]


def parallelism_term(step_ms: Dict[str, float], world_size: int) -> float:
    """How many local ranks' lookups really run at once: the table-wise step with one 16 MiB table on rank 0 under a
    heavy batch (its work L = that step less the tiny one) against one such table on every rank. The model prices
    the latter as max(L, world_size x L / parallelism), so parallelism = world_size x L / (L + its extra time).

    >>> parallelism_term({"tw_heavy": 12.0, "tw": 2.0, "tw_each_heavy": 12.0}, 2)
    2.0
    >>> parallelism_term({"tw_heavy": 12.0, "tw": 2.0, "tw_each_heavy": 22.0}, 2)
    1.0
    """
    work = max(step_ms["tw_heavy"] - step_ms["tw"], 1e-9)
    extra = max(step_ms["tw_each_heavy"] - step_ms["tw_heavy"], 0.0)
    return min(float(world_size), max(1.0, world_size * work / (work + extra)))


def fit_collectives(samples: Mapping[str, Sequence[Tuple[float, float]]]) -> Dict[str, AlphaBeta]:
    """One alpha-beta pair per collective kind, each fitted alike from its own (bytes, ms) samples (fit_alpha_beta).

    >>> fit_collectives({kind: [(0, 0.5), (1000, 1.5), (2000, 2.5)] for kind in COLLECTIVE_KINDS})["all_gather"]
    AlphaBeta(alpha_ms=0.5, bytes_per_ms=1000.0)
    """
    missing = [kind for kind in COLLECTIVE_KINDS if not samples.get(kind)]
    if missing:
        raise CalibrationError(f"calibration: no timings of {missing}; every kind of {COLLECTIVE_KINDS} is measured")
    return {kind: fit_alpha_beta(samples[kind]) for kind in COLLECTIVE_KINDS}


def _fit(payload: dict, world_size: int, backend: str, compute_device: str, threads: int, repeats: int,
         seconds: float) -> CalibrationProfile:
    reads = payload["reads"]
    collectives = fit_collectives(payload["collectives"])
    step, shard, group = fixed_terms(payload["fixed"], world_size)
    curve = tuple((size, round(bw, 1)) for size, bw in reads["read_curve"])
    machine = dict(host=platform.node(), processor=platform.processor() or platform.machine(), cores=os.cpu_count(),
                   torch=torch.__version__, device=compute_device, backend=backend, world_size=world_size,
                   threads_per_rank=threads, repeats=repeats, seconds=round(seconds, 1),
                   load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                   measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   load_probe=payload.get("load_probe"),
                   fixed_plan_step_ms={k: round(v, 4) for k, v in payload["fixed"].items()},
                   fixed_plan_step_ms_median={k: round(v, 4) for k, v in payload["fixed_median"].items()},
                   collective_samples={k: [[b, round(ms, 4)] for b, ms in v] for k, v in payload["collectives"].items()})
    terms = lambda values: LookupTerms(*(float(f"{x:.6g}") for x in values))  # noqa: E731
    profile = CalibrationProfile(
        collectives=collectives, read_curve=curve, write_bytes_per_ms=round(reads["write_bytes_per_ms"], 1),
        forward=terms(reads["forward"]), backward_terms={k: terms(v) for k, v in reads["backward"].items()},
        step_ms=step, group_ms=group, shard_ms=shard,
        memory_parallelism=round(parallelism_term(payload["fixed"], world_size), 3), machine=machine)
    profile = dataclasses.replace(profile, id_ms=round(id_term(payload["fixed"], world_size, profile), 8),
                                  id_row_bytes=float(READ_DIM * 4))
    profile = dataclasses.replace(profile,
                                  routing_id_ms=round(routing_id_term(payload["fixed"], world_size, profile), 8))
    shard_ms, replica_ms, routed_shard_ms = shard_terms(payload["fixed"], world_size, profile)
    return dataclasses.replace(profile, shard_ms=shard_ms, replica_ms=replica_ms, routed_shard_ms=routed_shard_ms)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rectoolkit.planner.calibrate", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2, help="local worker processes (ranks)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="compute device of the ranks")
    parser.add_argument("--out", default=str(default_profile_path()),
                        help="where to write the profile (JSON); Topology(profile='default') reads it from there")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (about half the time, noisier)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args(argv)
    profile = calibrate_profile(args.world_size, compute_device=args.device, quick=args.quick, threads=args.threads)
    path = profile.save(args.out)
    print(f"wrote {path} (measured in {profile.machine['seconds']} s)")
    for term, value in profile.summary_rows():
        print(f"  {term}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
