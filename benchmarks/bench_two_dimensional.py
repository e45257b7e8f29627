"""2D parallelism (DMPCollection) on 4 local CPU ranks: rectoolkit.planner.two_dimensional's estimate beside the
measured step, for every sharding group size and two sync intervals.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_two_dimensional.py   # writes results/two_dimensional.md
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_two_dimensional.py --no-write \
        --profile benchmarks/results/calibration_2core_2026-12-07.json --rounds 3
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_two_dimensional.py --plain --rounds 3 \
        --profile benchmarks/results/calibration_2core_2026-12-07.json   # the plain plans on 2 and 4 ranks

The workload: 8 tables of 20,000 x 32 (one feature each, 8 ids per bag on average, Zipf(1.05) ids), fused row-wise
Adagrad, batch 256 per rank, 4 ranks (gloo, one torch thread each) on this machine's cores. The Topology is
calibrated on this machine (Topology.calibrate(world_size=2), under a minute) unless `--profile` gives a saved
one; `compare_sharding_group_sizes` plans the tables for sharding groups of G = 1, 2 and 4 ranks (4: the plain
model, no replicas) and prices each with the sync every K steps. The same 4 workers then build the three
DMPCollections and time them in rounds, the order rotated each round so that machine load hits all alike: a
block of STEPS steps (forward, backward with the fused update, and sync() after every K-th step's backward),
started and ended on a barrier, the block's wall time over its steps on the slowest rank. Reported: per (G, K)
the median over the rounds [min, max] beside the estimate, their ratio, the bytes a rank sent per step in its
group's all-to-alls and per sync to its replicas (measured: CommStats; estimated), the load average before and
after.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.planner.constraints import ParameterConstraints
from rectoolkit.planner.topology import Topology
from rectoolkit.planner.two_dimensional import compare_sharding_group_sizes

WORLD, TABLES, ROWS, DIM, POOLING, BATCH = 4, 8, 20_000, 32, 8.0, 256
SIZES, INTERVALS, OPTIMIZER, WARMUP = (1, 2, 4), (1, 8), "row_wise_adagrad", 2


def tables() -> List[rtk.EmbeddingBagConfig]:
    return [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{i}"])
            for i in range(TABLES)]


def off_diagonal(rows: Any, own: int) -> int:
    """Bytes sent to the other ranks (each row indexed by destination; the rank's own chunk crosses no link)."""
    return sum(int(row.sum()) - int(row[own]) for row in rows)


def worker(ctx: Any, plans: Dict[int, Any], rounds: int, steps: int) -> Dict[str, Any]:
    from rectoolkit.distributed import DMPCollection
    from rectoolkit.train.data import SyntheticData

    data = SyntheticData(tables(), {f"f{i}": POOLING for i in range(TABLES)}, BATCH, dense_features=0,
                         zipf_alpha=1.05, seed=0, rank=ctx.rank, world_size=WORLD)
    batches = [data.batch(step).sparse_features for step in range(steps)]
    dmps = {}
    for size in SIZES:
        torch.manual_seed(0)
        model = rtk.EmbeddingBagCollection(tables(), optimizer=OPTIMIZER, lr=0.01)
        dmps[size] = DMPCollection(model, torch.device("cpu"), copy.deepcopy(plans[size]), world_size=WORLD,
                                   sharding_group_size=size, global_pg=dist.group.WORLD)

    def block(size: int, interval: int, count: int) -> float:
        dmp = dmps[size]
        dist.barrier()
        start = time.perf_counter()
        for step in range(count):
            dmp(batches[step % steps]).values().sum().backward()
            if (step + 1) % interval == 0:
                dmp.sync()
        dist.barrier()
        return 1000 * (time.perf_counter() - start) / count

    configs = [(size, interval) for interval in INTERVALS for size in SIZES]
    for size, interval in configs:
        block(size, interval, WARMUP)
    bytes_per = {}
    for size in SIZES:  # one step and one sync's bytes, counted
        dmp = dmps[size]
        dmp.env.stats.reset()
        dmp.sync_env.stats.reset()
        dmp(batches[0]).values().sum().backward()
        dmp.sync()
        bytes_per[size] = (off_diagonal(dmp.env.stats.bytes_sent.values(), dmp.env.rank),
                           off_diagonal(dmp.sync_env.stats.bytes_sent.values(), dmp.sync_env.rank))
    times: Dict[str, List[float]] = {f"{s},{k}": [] for s, k in configs}
    for r in range(rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for size, interval in order:
            times[f"{size},{interval}"].append(block(size, interval, steps))
    return {"rank": ctx.rank, "times": times, "bytes": bytes_per}


def plain_plans(topology_of: Any, rounds: int, steps: int) -> List[str]:
    """The workload's plain plans (the planner's, all table-wise, all row-wise) run by measure_plans on 2 and on 4
    ranks: how the estimate fares with no more ranks than cores, and with twice as many."""
    from rectoolkit.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from rectoolkit.planner import measure_plans

    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[POOLING]) for i in range(TABLES)}
    lines = ["| ranks | plan | estimated ms | measured ms (median, min) | measured / estimated | est. at the probed load |",
             "| ---: | --- | ---: | --- | ---: | ---: |"]
    for world in (2, 4):
        topology = topology_of(world)
        meta = rtk.EmbeddingBagCollection(tables(), device="meta")
        plans = {"planner": rtk.EmbeddingShardingPlanner(topology, batch_size=BATCH, constraints=constraints,
                                                          optimizer=OPTIMIZER).plan(tables())}
        for name, make in (("table_wise", lambda i: table_wise(rank=i % world)), ("row_wise", lambda i: row_wise())):
            plans[name] = rtk.ShardingPlan({"": construct_module_sharding_plan(
                meta, {f"t{i}": make(i) for i in range(TABLES)}, world_size=world, device_type="cpu")})
        result = measure_plans(plans, tables(), world, steps=steps, rounds=rounds, batch_size=BATCH,
                               pooling_factors={f"f{i}": POOLING for i in range(TABLES)}, zipf_alpha=1.05,
                               topology=topology, optimizer=OPTIMIZER)
        for row in result.plans.itertuples():
            lines.append(f"| {world} | {row.plan} | {row.est_step_ms:.1f} | {row.step_ms:.1f}, {row.step_ms_min:.1f} | "
                         f"{row.measured_over_estimated:.2f} | {row.est_now_ms:.1f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="a saved calibration profile (default: calibrate now)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per block (a multiple of every interval)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--plain", action="store_true",
                        help="instead: the plain plans on 2 and 4 ranks (measure_plans), estimate beside measured")
    args = parser.parse_args()
    if any(args.steps % k for k in INTERVALS):
        raise SystemExit(f"--steps must be a multiple of every sync interval {INTERVALS}")
    load_before = os.getloadavg()
    profile = args.profile or Topology.calibrate(world_size=2).profile
    if args.plain:
        lines = plain_plans(lambda world: Topology.from_profile(profile, world_size=world), args.rounds, args.steps)
        print(f"load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
        print("\n".join(lines))
        return
    topology = Topology.from_profile(profile, world_size=WORLD)
    constraints = {f"t{i}": ParameterConstraints(pooling_factors=[POOLING]) for i in range(TABLES)}
    frames = {k: compare_sharding_group_sizes(tables(), topology, SIZES, sync_interval=k, batch_size=BATCH,
                                              optimizer=OPTIMIZER, constraints=constraints) for k in INTERVALS}
    plans = {int(row.sharding_group_size): row.plan for row in frames[INTERVALS[0]].itertuples()}
    results = rtk.launch(worker, WORLD, plans, args.rounds, args.steps, num_threads=1)
    load_after = os.getloadavg()
    lines = [f"# bench_two_dimensional: {WORLD} ranks, {TABLES} tables of {ROWS:,} x {DIM}, pooling {POOLING:g}, "
             f"batch {BATCH} per rank, {OPTIMIZER}; {args.rounds} rounds of {args.steps} steps; {platform.node()}, "
             f"{os.cpu_count()} cores, torch {torch.__version__}, 1 thread per rank; load average "
             f"{load_before[0]:.1f} before, {load_after[0]:.1f} after; cores_per_host {topology.cores_per_host}", "",
             "| G | replicas | sync every | measured ms | estimated ms | measured / estimated | group step est. ms | "
             "sync est. ms | a2a bytes/step (meas. / est.) | sync bytes/sync (meas. / est.) |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    for k in INTERVALS:
        for row in frames[k].itertuples():
            g = int(row.sharding_group_size)
            slowest = [max(r["times"][f"{g},{k}"][i] for r in results) for i in range(args.rounds)]
            med = statistics.median(slowest)
            a2a = max(r["bytes"][g][0] for r in results)
            sync = max(r["bytes"][g][1] for r in results)
            lines.append(f"| {g} | {row.replicas} | {k} | {med:.1f} [{min(slowest):.1f}, {max(slowest):.1f}] | "
                         f"{row.step_ms:.1f} | {med / row.step_ms:.2f} | {row.group_step_ms:.1f} | {row.sync_ms:.1f} | "
                         f"{a2a:,} / {row.all_to_all_bytes_per_step:,.0f} | {sync:,} / {row.sync_bytes_per_sync:,.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (Path(__file__).resolve().parent / "results" / "two_dimensional.md").write_text(text)


if __name__ == "__main__":
    main()
