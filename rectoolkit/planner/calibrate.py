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
   memory), each at two row widths and two batch sizes -> the read speed curve (ms per byte of the distinct rows
   a batch reads: a row read again is in cache), the cost per id and per output byte, solved from the four timings
   so the call's fixed part is left out; the same timings of the backward + fused update at 16 MiB -> its terms
   for SGD, scaled for the other optimizers by their measured extra time; a large copy -> the write speed;
3. fixed costs: the sharded EmbeddingBagCollection itself on tiny tables (table-wise alone, four table-wise,
   each sharding type beside a table-wise one) -> ms per step and per table-wise group; a 16 MiB table
   table-wise on every rank with a small table table-wise, or of each other sharding type (a group of its own),
   on the wall clock -> ms per group of the other types (what synchronizing the ranks inside real work costs
   beyond the calls' latency); one and four small
   tables under a full batch, table-wise, replicated and row-wise -> ms per shard, per data-parallel replica
   and per row-routed shard; a 16 MiB table of 64-wide rows, table-wise, at 2, 5, 10 and 20 ids per bag on two
   collections built apart -> the engine's work per id beyond what 2. prices (the least-squares slope through
   all eight steps: one built collection can sit 10-20% off another); the same table's input_dist alone,
   table-wise and row-wise at 2, 20, 50 and 100 ids per bag -> row-block routing per id (the row-wise slope per id
   received over table-wise's; an input_dist is short, so it takes many ids for the rise to stand out);
   a heavy lookup into a 16 MiB table, on rank 0 alone and on every rank at once (the kernels, no collectives) ->
   how well local ranks run at once;
4. on gloo, rectoolkit.planner.load's synthetic step -> the machine's load factor while it calibrated
   (`machine["load_probe"]`, a record: the terms above are fastest repeats and CPU times, which load moves little).

The fits that turn these timings into the profile's terms: rectoolkit.planner.calibration_fit.

From a script, call it under `if __name__ == "__main__":` (the workers are spawned and re-import the script).

    >>> from rectoolkit.planner.profile import CalibrationProfile
    >>> isinstance(calibrate_profile.__doc__, str)
    True
"""

from __future__ import annotations

import argparse
import datetime
import functools
import multiprocessing
import os
import queue as queue_module
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from rectoolkit.launch.affinity import CpuBinding, all_rank_cpus, bind_this_process
from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from rectoolkit.planner.calibration_fit import (A2A_PEER_BYTES, BESIDE_KINDS, BESIDE_ROUNDS_PER_REPEAT,
                                                BUFFER_BYTES, ENGINE_INSTANCES, ENGINE_POOLINGS, HEAVY_POOLING,
                                                INPUT_POOLINGS, LOOKUP_DIMS, LOOKUP_IDS_PER_BAG, LOOKUP_SAMPLES,
                                                MIN_MS_PER_BYTE, READ_BATCH, READ_DIM, READ_POOLING, READ_TABLE_BYTES,
                                                SMALL_TABLE_ROWS, ZIPF_ALPHA, CalibrationError, fit_profile,
                                                lookup_slopes, monotone_curve)
from rectoolkit.planner.load import measure_load
from rectoolkit.planner.profile import (COLLECTIVE_KINDS, OPTIMIZERS, SHARDING_TYPES, CalibrationProfile,
                                        default_profile_path, expected_rows_read)


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
    """The (dim, ids per bag) -> ms timings of one optimizer and table size (what lookup_slopes reads)."""
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
            id_ms, per_byte, output_ms = lookup_slopes(_at(times, None, table_bytes), table_bytes=table_bytes)
            curve.append((float(table_bytes), 1.0 / max(per_byte, MIN_MS_PER_BYTE)))
            id_costs.append(id_ms)
            output_costs.append(output_ms)
        curve = monotone_curve(curve)
        middle_per_byte = 1.0 / dict(curve)[float(middle)]
        sgd = lookup_slopes(_at(times, "sgd", middle), middle_per_byte, table_bytes=middle)
        backward = {"sgd": sgd}
        small, large = LOOKUP_IDS_PER_BAG
        dim = LOOKUP_DIMS[1]
        rows = middle // (4 * dim)
        extra_reads = expected_rows_read(large * LOOKUP_SAMPLES, rows) - expected_rows_read(small * LOOKUP_SAMPLES, rows)
        sgd_extra = (large - small) * LOOKUP_SAMPLES * sgd[0] + extra_reads * 4.0 * dim * sgd[1] * middle_per_byte
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
    """One training step (forward + backward + fused SGD; the replicas' dense SGD) of a sharded collection of `plan`'s
    tables (`rows` x `dim` each), every table's feature given the same ids and lengths."""
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


def _features_batch(tables, ids: torch.Tensor, lengths: torch.Tensor):
    """A KeyedJaggedTensor giving every table's feature ("f_<table>") these ids and lengths."""
    from rectoolkit.sparse import KeyedJaggedTensor

    return KeyedJaggedTensor.from_lengths_sync([f"f_{t}" for t in tables], ids.repeat(len(tables)).to(_device()),
                                               lengths.repeat(len(tables)).to(_device()))


def _step_call(sharded, plan: Dict[str, object], ids: torch.Tensor, lengths: torch.Tensor):
    """A training step of `sharded` on these ids and lengths for every table's feature."""
    return _kjt_step(sharded, _features_batch(plan, ids, lengths))


def _kjt_step(sharded, kjt):
    """A training step of `sharded` on the batch `kjt`: forward, backward with the fused update, and the dense
    optimizer's step (SGD) over the plain weights, the DATA_PARALLEL replicas' (TorchRec's dense kernel)."""
    plain = [p for p in sharded.parameters() if not hasattr(p, "_in_backward_optimizers")]
    dense = torch.optim.SGD(plain, lr=1e-6) if plain else None

    def step() -> None:
        sharded(kjt).values().sum().backward()
        if dense is not None:
            dense.step()
            dense.zero_grad(set_to_none=True)

    return step


def _input_dist_call(sharded, ids: torch.Tensor, lengths: torch.Tensor):
    """The input_dist alone of `sharded` (one table, feature "f_t0") on these ids and lengths."""
    kjt = _features_batch(["t0"], ids, lengths)
    return lambda: sharded.start_input_dist(kjt).wait()


def measure_fixed_costs(rank: int, world_size: int, repeats: int) -> Tuple[Dict[str, float], Dict[str, float]]:
    """(fastest, median) step (sharded EBC forward + backward + fused SGD) of each plan below over the rounds,
    slowest rank, in ms (this thread's CPU time: the groups' Python and kernel work; their collectives' latency is
    priced by alpha), all timed interleaved (timed_each)."""
    from rectoolkit.distributed.comm import ShardingEnv

    env = ShardingEnv.from_process_group(local_world_size=world_size, device=_device())
    calls = {}
    # tiny tables, 8 bags of one id: the fixed costs per step and per sharding-type group
    rows, dim, bags = SMALL_TABLE_ROWS, 8 * world_size, 8
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
    # routing), at ENGINE_POOLINGS ids per bag on ENGINE_INSTANCES collections built apart, each with its own ids:
    # table-wise its step ("tw_p20_1": 20 ids per bag, the second collection; the rise per id is the engine's slope,
    # engine_slope) and both their input_dist alone ("rw_in_p20_1"; routing_id_term)
    rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    plans = {"tw": {"t0": _tiny_parameter_sharding("table_wise", rows, READ_DIM, 1)},
             "rw": {"t0": _tiny_parameter_sharding("row_wise", rows, READ_DIM, env.world_size)}}
    for name, plan in plans.items():
        for instance in range(ENGINE_INSTANCES):
            sharded = _sharded_collection(env, plan, rows, READ_DIM)
            for pooling in sorted(set(ENGINE_POOLINGS) | set(INPUT_POOLINGS)):
                batch = _lookup_batch(rows, seed=rank + 1000 * instance, pooling=pooling)
                if pooling in INPUT_POOLINGS:
                    calls[f"{name}_in_p{pooling}_{instance}"] = _input_dist_call(sharded, batch.values(),
                                                                                batch.lengths())
                if name == "tw" and pooling in ENGINE_POOLINGS:
                    calls[f"{name}_p{pooling}_{instance}"] = _step_call(sharded, plan, batch.values(), batch.lengths())
    times = timed_each(calls, repeats, synced=True)
    return {key: min(t) for key, t in times.items()}, {key: float(np.median(t)) for key, t in times.items()}


def _beside_plans(world_size: int) -> Dict[str, Dict[str, object]]:
    """The plan-sized steps of measure_groups_beside: name -> plan. "beside_table_wise": one 16 MiB table
    table-wise on every rank and a SMALL_TABLE_ROWS one table-wise on rank 0; "beside_<kind>": the small table of
    that sharding type instead, a group of its own beside the table-wise one."""
    rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    heavy = {f"h{r}": ParameterSharding("table_wise", ranks=[r],
                                        shards=[ShardMetadata.on_rank(r, 0, 0, rows, READ_DIM)])
             for r in range(world_size)}
    return {f"beside_{kind}": {**heavy, "s": _tiny_parameter_sharding(kind, SMALL_TABLE_ROWS, READ_DIM, world_size)}
            for kind in BESIDE_KINDS}


def measure_groups_beside(rank: int, world_size: int, repeats: int) -> Dict[str, List[float]]:
    """The step (sharded EBC forward + backward + fused SGD) of each of _beside_plans, slowest rank, in ms of wall
    time, in each of BESIDE_ROUNDS_PER_REPEAT x `repeats` rounds, all timed interleaved (group_terms_beside reads the
    fastest of each; the profile keeps every round). A group's
    collectives synchronize the ranks inside a step of real work, and on the wall clock that costs more than its
    calls' latency alone: on the 2-core CPU machine one 305-row table of dlrm26_100k row-wise instead of table-wise
    made the step 1.18-1.23x (median of 10 rounds), where the tiny steps of measure_fixed_costs priced it 1.08x."""
    from rectoolkit.distributed.comm import ShardingEnv
    from rectoolkit.distributed.sharded_ebc import shard_embedding_bag_collection
    from rectoolkit.modules.configs import EmbeddingBagConfig
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection
    from rectoolkit.sparse import KeyedJaggedTensor

    env = ShardingEnv.from_process_group(local_world_size=world_size, device=_device())
    heavy_rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    heavy = _lookup_batch(heavy_rows, seed=rank, pooling=READ_POOLING)
    small = torch.arange(READ_BATCH) % SMALL_TABLE_ROWS  # one id per bag
    calls = {}
    for name, plan in _beside_plans(world_size).items():
        sizes = {t: (SMALL_TABLE_ROWS if t == "s" else heavy_rows) for t in plan}
        ebc = EmbeddingBagCollection([EmbeddingBagConfig(name=t, num_embeddings=n, embedding_dim=READ_DIM,
                                                         feature_names=[f"f_{t}"]) for t, n in sizes.items()],
                                     device=_device(), optimizer="sgd", lr=1e-6)
        sharded = shard_embedding_bag_collection(ebc, plan, env)
        ids = [small if t == "s" else heavy.values() for t in plan]
        lengths = [torch.ones(READ_BATCH, dtype=torch.int32) if t == "s" else heavy.lengths() for t in plan]
        kjt = KeyedJaggedTensor.from_lengths_sync([f"f_{t}" for t in plan], torch.cat(ids).to(_device()),
                                                  torch.cat(lengths).to(_device()))
        calls[name] = _kjt_step(sharded, kjt)
    return timed_each(calls, BESIDE_ROUNDS_PER_REPEAT * repeats, clock=time.perf_counter, synced=True)


def measure_sharing(rank: int, world_size: int, repeats: int) -> Tuple[List[float], List[float]]:
    """(alone, together): per round, the slowest rank's time of a heavy lookup (forward, backward and fused SGD
    update of HEAVY_POOLING ids per bag into a 16 MiB table of its own) on rank 0 while the others wait, then on
    every rank at once, in ms of this thread's CPU time (calibration_fit.parallelism_term)."""
    rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    lookup = _backward_call(_lookup_module(rows, READ_DIM, "sgd"),
                            _lookup_batch(rows, seed=rank, pooling=HEAVY_POOLING))
    times = timed_each({"alone": lookup if rank == 0 else (lambda: None), "together": lookup}, repeats, synced=True)
    return times["alone"], times["together"]


# ------------------------------------------------------------------------------------------------ workers
def _worker(rank: int, world_size: int, init_file: str, backend: str, compute_device: str, repeats: int,
            threads: int, results, cpus: Optional[List[int]] = None) -> None:
    global _ON_CUDA
    try:
        bind_this_process(cpus)  # before gloo starts its threads, which inherit the cores
        _ON_CUDA = compute_device == "cuda"
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        collectives = measure_collectives(world_size, repeats)
        reads = measure_lookups(rank, world_size, repeats)
        fixed, fixed_median = measure_fixed_costs(rank, world_size, repeats)
        beside = measure_groups_beside(rank, world_size, repeats)
        sharing = measure_sharing(rank, world_size, repeats)
        # the load factor while calibrating, for the record (rectoolkit.planner.load; CPU tensors: gloo)
        probe = measure_load().to_dict() if backend == "gloo" else None
        if rank == 0:
            _report(results, ("ok", dict(collectives=collectives, reads=reads, fixed=fixed, fixed_median=fixed_median,
                                         beside=beside, sharing=sharing, load_probe=probe)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        _report(results, ("error", f"rank {rank}:\n{traceback.format_exc()}"))
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)  # leave without interpreter teardown, where gloo's threads can abort a finished process


def _report(results, item) -> None:
    """Put `item` on the queue and wait until it is in the pipe. A Queue's put only hands the item to a feeder
    thread, which pickles and writes it later; the worker ends with os._exit, which kills that thread, so without
    the wait a report could be lost (the caller then waited out its whole timeout for a finished calibration) or
    cut short in the pipe (the caller's read then blocked for good)."""
    results.put(item)
    results.close()
    results.join_thread()


def _refuse_in_spawned_child() -> None:
    if multiprocessing.parent_process() is not None and getattr(multiprocessing.current_process(), "_inheriting", False):
        raise CalibrationError(
            "rectoolkit calibration was started while a spawned worker re-imported your script: call "
            "Topology.calibrate() / calibrate_profile() under `if __name__ == \"__main__\":` in a script")


def calibrate_profile(world_size: int = 2, compute_device: str = "cpu", repeats: Optional[int] = None,
                      quick: bool = False, threads: int = 1, timeout_s: float = 600.0,
                      cpu_binding: CpuBinding = "none") -> CalibrationProfile:
    """Run the micro-benchmarks on `world_size` local workers and fit a CalibrationProfile (module docstring).

    `cpu_binding` places the workers on cores as `rectoolkit.launch` places its ranks (default "none": where the
    scheduler puts them; "auto": each its own share of the cores). Calibrate as the ranks you plan for will run
    (`measure_plans` and training take the same argument); the profile records the cores each rank had
    (`machine["cpus"]`)."""
    _refuse_in_spawned_child()
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"calibrate: world_size must be an int >= 2 (collectives need two ranks), got {world_size!r}")
    cpus = all_rank_cpus(cpu_binding, world_size)
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
                                                             results, cpus[r]),
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
    payload["cpus"] = cpus
    return fit_profile(payload, world_size, backend, compute_device, threads, repeats, time.time() - started)


def _wait_for_result(procs, results, timeout_s: float):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue_module.Empty:
            pass
        dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead or all(p.exitcode == 0 for p in procs):
            try:
                return results.get(timeout=2.0)
            except queue_module.Empty:
                pass
            if not dead:
                raise CalibrationError("every calibration worker exited (code 0) without reporting a result; "
                                       "this is a rectoolkit bug: please report it with the workers' output above")
            rank, code = dead[0]
            raise CalibrationError(
                f"calibration worker rank {rank} exited with code {code} before reporting. From a script, call "
                "Topology.calibrate() under `if __name__ == \"__main__\":` (spawned workers re-import the script); "
                "otherwise see the worker's output above")
    raise CalibrationError(f"calibration did not finish within {timeout_s:.0f} s (machine overloaded or a worker "
                           "hung); retry with quick=True or a larger timeout_s")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rectoolkit.planner.calibrate", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2, help="local worker processes (ranks)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="compute device of the ranks")
    parser.add_argument("--out", default=str(default_profile_path()),
                        help="where to write the profile (JSON); Topology(profile='default') reads it from there")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (about half the time, noisier)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--cpu-binding", choices=("none", "auto"), default="none",
                        help="none: wherever the scheduler puts the ranks; auto: each rank on its own share of the "
                             "cores (as rectoolkit.launch runs them with cpu_binding='auto')")
    args = parser.parse_args(argv)
    profile = calibrate_profile(args.world_size, compute_device=args.device, quick=args.quick, threads=args.threads,
                                cpu_binding=args.cpu_binding)
    path = profile.save(args.out)
    print(f"wrote {path} (measured in {profile.machine['seconds']} s)")
    for term, value in profile.summary_rows():
        print(f"  {term}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
