"""Measure this machine's cost-model terms and save them as a CalibrationProfile (JSON).

    python -m rectoolkit.planner.calibrate --world-size 2      # then Topology(..., profile="default")

Short micro-benchmarks of rectoolkit's own kernels and collectives run on `world_size` spawned local workers (gloo
on CPU, NCCL on CUDA), one torch thread per rank, and each term is fitted from the fastest of several repeats (a
busy machine slows some repeats, rarely all, so the minimum moves little with load):

1. collectives: all_to_all_single and all_reduce at five message sizes -> alpha (ms per call) and bytes/ms;
2. reads: one table's pooled lookup (uniform ids) at four table sizes, from 256 KiB (in cache)
   to 128 MiB (in memory) -> the read speed curve; the same on every rank at once -> how much local ranks share
   the memory bus; a large copy -> the write speed;
3. backward: the fused backward + update against the forward, per optimizer;
4. fixed costs: the sharded EmbeddingBagCollection itself on tiny tables (table-wise alone, four table-wise,
   each sharding type beside a table-wise one) -> ms per step, per shard and per sharding-type group; and one
   16 MiB table-wise table under a full batch -> the engine's work per id beyond what 2. and 3. price.

From a script, call it under `if __name__ == "__main__":` (the workers are spawned and re-import the script).

    >>> from rectoolkit.planner.profile import CalibrationProfile
    >>> isinstance(calibrate_profile.__doc__, str)
    True
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import platform
import queue as queue_module
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from rectoolkit.planner.profile import SHARDING_TYPES, CalibrationProfile, default_profile_path, fit_alpha_beta

A2A_PEER_BYTES = (64, 4 << 10, 64 << 10, 512 << 10, 2 << 20)  # bytes to each peer
ALLREDUCE_BYTES = (256, 16 << 10, 256 << 10, 2 << 20, 8 << 20)
READ_TABLE_BYTES = (256 << 10, 2 << 20, 16 << 20, 128 << 20)
READ_DIM = 64
READ_BATCH, READ_POOLING = 512, 20
OPTIMIZERS = ("sgd", "adagrad", "row_wise_adagrad", "adam")
ZIPF_ALPHA = 0.0  # uniform ids: a shard's working set is all of it (skewed ids would make big tables look cached)


class CalibrationError(RuntimeError):
    """Calibration could not run; the message says why and what to do."""


# ------------------------------------------------------------------------------------------------ timing
def _clock() -> Callable[[], float]:
    """Compute is timed in this thread's CPU time on CPU (other processes' load does not stretch it), wall on CUDA."""
    return time.perf_counter if torch.cuda.is_available() else time.thread_time


def fastest_ms(fn: Callable[[], object], repeats: int, clock: Optional[Callable[[], float]] = None) -> float:
    """The fastest of `repeats` timed calls of fn, in ms (one untimed call first)."""
    clock = clock or _clock()
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        fn()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        best = min(best, (clock() - start) * 1000.0)
    return best


def _synced_fastest_ms(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """fastest_ms of a call every rank makes together; the slowest rank's time for each repeat (wall clock by
    default: a collective's time is waiting too)."""
    fn()
    best = float("inf")
    slowest = torch.zeros(1, dtype=torch.float64, device=_device())
    for _ in range(repeats):
        dist.barrier()
        start = clock()
        fn()
        if _device().type == "cuda":
            torch.cuda.synchronize()
        slowest[0] = (clock() - start) * 1000.0
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        best = min(best, float(slowest[0]))
    return best


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ------------------------------------------------------------------------------------------------ the parts
def measure_collectives(world_size: int, repeats: int) -> Dict[str, List[Tuple[float, float]]]:
    """(bytes one rank sends + receives, fastest ms) per collective kind and message size."""
    device = _device()
    samples: Dict[str, List[Tuple[float, float]]] = {"all_to_all": [], "all_reduce": []}
    for peer_bytes in A2A_PEER_BYTES:
        send = torch.ones(world_size * peer_bytes // 4, device=device)
        recv = torch.empty_like(send)
        ms = _synced_fastest_ms(lambda: dist.all_to_all_single(recv, send), _repeats_for(peer_bytes, repeats))
        samples["all_to_all"].append((2.0 * (world_size - 1) * peer_bytes, ms))
    for total in ALLREDUCE_BYTES:
        buffer = torch.ones(total // 4, device=device)
        ms = _synced_fastest_ms(lambda: dist.all_reduce(buffer), _repeats_for(total, repeats))
        # a ring all-reduce: each rank sends and receives 2 (W-1)/W of the buffer
        samples["all_reduce"].append((2.0 * 2.0 * (world_size - 1) / world_size * total, ms))
    return samples


def _repeats_for(message_bytes: int, repeats: int) -> int:
    """Twice the repeats for small messages: they are cheap, and their fastest repeat is the latency (alpha), which a
    loaded machine's scheduling delays hide in most repeats."""
    return repeats * 2 if message_bytes <= 64 << 10 else repeats


def _lookup_module(rows: int, dim: int, optimizer: Optional[str]):
    from rectoolkit.modules.configs import EmbeddingBagConfig
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection

    config = EmbeddingBagConfig(name="t", num_embeddings=rows, embedding_dim=dim, feature_names=["f"])
    if optimizer is None:
        return EmbeddingBagCollection([config], device=_device())
    return EmbeddingBagCollection([config], device=_device(), optimizer=optimizer, lr=1e-6)


def _lookup_batch(rows: int, seed: int, batch_size: int = READ_BATCH):
    from rectoolkit.sparse import KeyedJaggedTensor
    from rectoolkit.train.data import zipf_ids

    generator = torch.Generator().manual_seed(seed)
    ids = zipf_ids(batch_size * READ_POOLING, rows, ZIPF_ALPHA, generator)
    lengths = torch.full((batch_size,), READ_POOLING, dtype=torch.int32)
    return KeyedJaggedTensor.from_lengths_sync(["f"], ids.to(_device()), lengths.to(_device()))


def _read_ms_per_byte(module, rows: int, rank: int, repeats: int, together: bool = False) -> float:
    """ms per byte read by a full batch's lookup (its outputs and the call's small fixed part included: a
    difference of two fastest times would be steadier in theory, but on a busy machine it is mostly noise)."""
    batch = _lookup_batch(rows, rank, READ_BATCH)
    if together:
        ms = _synced_fastest_ms(lambda: module(batch), repeats, clock=_clock())
    else:
        ms = fastest_ms(lambda: module(batch), repeats)
    return ms / (batch.values().numel() * READ_DIM * 4)


def measure_reads(rank: int, world_size: int, repeats: int) -> Dict[str, object]:
    """Read speed by table size (one rank alone), all ranks at once, the write speed and backward factors."""
    copy_source = torch.ones(16 << 20 >> 2, device=_device())
    copy_target = torch.empty_like(copy_source)
    copy_ms = fastest_ms(lambda: copy_target.copy_(copy_source), repeats)
    write_bytes_per_ms = 2.0 * copy_source.numel() * 4 / copy_ms  # read + write of a large copy
    curve, alone, alone_middle, together = [], None, None, None
    with torch.no_grad():
        for table_bytes in READ_TABLE_BYTES:
            rows = table_bytes // (READ_DIM * 4)
            module = _lookup_module(rows, READ_DIM, None)
            if rank == 0:
                per_byte = _read_ms_per_byte(module, rows, rank, repeats)
                curve.append((float(table_bytes), 1.0 / per_byte))
                alone = per_byte
            dist.barrier()
            if table_bytes == READ_TABLE_BYTES[2]:  # a typical shard's size: how well two ranks read at once
                alone_middle = alone
                together = _read_ms_per_byte(module, rows, rank, repeats, together=True)
            del module
    parallelism = float(world_size)
    if rank == 0 and world_size > 1:
        parallelism = min(float(world_size), max(1.0, world_size * alone_middle / together))
    middle_rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    batch = _lookup_batch(middle_rows, seed=rank, batch_size=4 * READ_BATCH)  # the backward's fixed part weighs less
    backward = {}
    for optimizer in OPTIMIZERS:
        module = _lookup_module(middle_rows, READ_DIM, optimizer)
        with torch.no_grad():
            forward_ms = fastest_ms(lambda: module(batch), repeats)
        both_ms = fastest_ms(lambda: module(batch).values().sum().backward(), repeats)
        backward[optimizer] = round(max(both_ms - forward_ms, 0.0) / max(forward_ms, 1e-6), 3)
    return dict(write_bytes_per_ms=write_bytes_per_ms, read_curve=curve,
                memory_parallelism=parallelism, backward_factor=backward)


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
    from rectoolkit.plan.types import ParameterSharding, ShardMetadata

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


def measure_fixed_costs(rank: int, world_size: int, repeats: int) -> Dict[str, float]:
    """Fastest step (sharded EBC forward + backward + fused SGD) of each tiny plan, slowest rank, in ms."""
    from rectoolkit.distributed.comm import ShardingEnv
    from rectoolkit.distributed.sharded_ebc import shard_embedding_bag_collection
    from rectoolkit.modules.configs import EmbeddingBagConfig
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection
    from rectoolkit.sparse import KeyedJaggedTensor

    rows, dim, batch_size = 64, 8 * world_size, 8
    env = ShardingEnv.from_process_group(local_world_size=world_size, device=_device())
    step_ms = {}
    for name, kinds in _fixed_cost_plans(world_size).items():
        configs = [EmbeddingBagConfig(name=t, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f_{t}"])
                   for t in kinds]
        ebc = EmbeddingBagCollection(configs, device=_device(), optimizer="sgd", lr=1e-6)
        plan = {t: _tiny_parameter_sharding(kind, rows, dim, world_size) for t, kind in kinds.items()}
        sharded = shard_embedding_bag_collection(ebc, plan, env)
        keys = [f"f_{t}" for t in kinds]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys, torch.arange(len(keys) * batch_size, device=_device()) % rows,
            torch.ones(len(keys) * batch_size, dtype=torch.int32, device=_device()))
        # CPU time: the Python and kernel work of the groups; their collectives' latency is priced by alpha
        step_ms[name] = _synced_fastest_ms(lambda: sharded(kjt).values().sum().backward(), repeats, clock=_clock())
    # the engine under a real batch: one 16 MiB table-wise table on rank 0, READ_BATCH x READ_POOLING ids per rank
    rows = READ_TABLE_BYTES[2] // (READ_DIM * 4)
    ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="a", num_embeddings=rows, embedding_dim=READ_DIM,
                                                     feature_names=["f_a"])], device=_device(), optimizer="sgd", lr=1e-6)
    sharded = shard_embedding_bag_collection(ebc, {"a": _tiny_parameter_sharding("table_wise", rows, READ_DIM, 1)}, env)
    batch = _lookup_batch(rows, seed=rank)
    kjt = KeyedJaggedTensor.from_lengths_sync(["f_a"], batch.values(), batch.lengths())
    step_ms["tw_full"] = _synced_fastest_ms(lambda: sharded(kjt).values().sum().backward(), repeats, clock=_clock())
    # the same table row-wise: what bucketing ids by row block costs per id, beyond table-wise's routing
    sharded = shard_embedding_bag_collection(
        ebc, {"a": _tiny_parameter_sharding("row_wise", rows, READ_DIM, env.world_size)}, env)
    step_ms["rw_full"] = _synced_fastest_ms(lambda: sharded(kjt).values().sum().backward(), repeats, clock=_clock())
    return step_ms


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
def _worker(rank: int, world_size: int, init_file: str, backend: str, repeats: int, threads: int, results) -> None:
    try:
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=120))
        collectives = measure_collectives(world_size, repeats)
        reads = measure_reads(rank, world_size, repeats)
        fixed = measure_fixed_costs(rank, world_size, repeats)
        if rank == 0:
            results.put(("ok", dict(collectives=collectives, reads=reads, fixed=fixed)))
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
        procs = [context.Process(target=_worker, args=(r, world_size, init_file, backend, repeats, threads, results),
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


def id_term(step_ms: Dict[str, float], world_size: int, read_ms_per_byte: float, write_bytes_per_ms: float,
            backward_factor: float) -> float:
    """ms per id a shard receives (forward + backward) that reads, writes and the backward factor leave out: the
    16 MiB table-wise step less the tiny one, less what the read and write terms price for its rows.

    >>> round(id_term({"tw_full": 20.0, "tw": 2.0}, 2, read_ms_per_byte=1e-6, write_bytes_per_ms=1e6,
    ...               backward_factor=1.0), 7)
    0.0003413
    """
    ids = world_size * READ_BATCH * READ_POOLING
    rows_ms = ids * READ_DIM * 4 * read_ms_per_byte + world_size * READ_BATCH * READ_DIM * 4 / write_bytes_per_ms
    return max(step_ms["tw_full"] - step_ms["tw"] - rows_ms * (1.0 + backward_factor), 0.0) / ids


def routing_id_term(step_ms: Dict[str, float], world_size: int) -> float:
    """ms per id that row-block routing (row-wise, table-row-wise, grid) adds to table-wise routing: the full-batch
    row-wise step less the table-wise one, less the difference of their tiny steps (their fixed parts).

    >>> round(routing_id_term({"rw_full": 12.0, "tw_full": 8.0, "row_wise": 3.0, "tw": 2.0}, 2), 8)
    0.00014648
    """
    ids = world_size * READ_BATCH * READ_POOLING
    extra = (step_ms["rw_full"] - step_ms["tw_full"]) - (step_ms["row_wise"] - step_ms["tw"])
    return max(extra, 0.0) / ids


def _fit(payload: dict, world_size: int, backend: str, compute_device: str, threads: int, repeats: int,
         seconds: float) -> CalibrationProfile:
    reads = payload["reads"]
    collectives = {kind: fit_alpha_beta(samples) for kind, samples in payload["collectives"].items()}
    step, shard, group = fixed_terms(payload["fixed"], world_size)
    curve = tuple((size, round(bw, 1)) for size, bw in reads["read_curve"])
    middle_read = 1.0 / dict(curve)[float(READ_TABLE_BYTES[2])]
    per_id = id_term(payload["fixed"], world_size, middle_read, reads["write_bytes_per_ms"],
                     reads["backward_factor"]["sgd"])
    machine = dict(host=platform.node(), processor=platform.processor() or platform.machine(), cores=os.cpu_count(),
                   torch=torch.__version__, device=compute_device, backend=backend, world_size=world_size,
                   threads_per_rank=threads, repeats=repeats, seconds=round(seconds, 1),
                   load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                   measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   fixed_plan_step_ms={k: round(v, 4) for k, v in payload["fixed"].items()},
                   collective_samples={k: [[b, round(ms, 4)] for b, ms in v] for k, v in payload["collectives"].items()})
    return CalibrationProfile(
        collectives=collectives,
        read_curve=curve,
        write_bytes_per_ms=round(reads["write_bytes_per_ms"], 1), step_ms=step, group_ms=group, shard_ms=shard,
        id_ms=round(per_id, 8), routing_id_ms=round(routing_id_term(payload["fixed"], world_size), 8),
        backward_factor=reads["backward_factor"], memory_parallelism=round(reads["memory_parallelism"], 3),
        machine=machine)


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
