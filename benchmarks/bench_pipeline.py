"""Steps per second of sharded training with and without TrainPipelineSparseDist, 2 CPU ranks (gloo).

    .venv/bin/python benchmarks/bench_pipeline.py              # both workloads, 3 runs each; writes results/pipeline.md
    .venv/bin/python benchmarks/bench_pipeline.py --quick --no-write --threads 4     # ~1 minute on a free 16-core box
    .venv/bin/python benchmarks/bench_pipeline.py --cpu-binding both --no-write      # unbound / bound runs alternating

Workloads (`--workload`, default both):
- `base`: 8 tables of 20,000 x 8, one feature each, ~32 ids per bag (lengths uniform in 0..64), batch 512 per rank,
  TABLE_WISE (tables alternate between the ranks).
- `comm`: the communication-heavy one: 16 tables of 20,000 x 8, ~64 ids per bag, batch 256 per rank, ROW_WISE
  (every table cut in two row blocks: every id is bucketed and crosses the all-to-all, and each rank returns
  partial sums of every feature), so that blocking collectives are a larger part of the step.
Both: fused Adagrad for the tables, Adam for a small dense part (DDP), 2 ranks, `--threads` intra-op threads each.

Three DMPs built alike train on the same batches: one through the plain loop (zero_grad, forward, backward, step),
one through the pipeline, one through the pipeline with background_input_dist=False ("inline"). After 5 warm-up
steps, ROUNDS rounds alternate the three (STEPS timed steps each, ranks aligned by a barrier, the slowest rank
counts). Printed per run: the median and range of steps/s, the median of the
per-round ratios, the communication share (time the ranks spent blocked in the sharded modules' collectives, over
their time: CommStats.wait_s; DDP's all-reduce not included) of each loop, split into the input_dist part (sizes +
ids all-to-all) and the rest (output_dist and its backward), the plain loop's input_dist share end to end (split,
id check, routing and both exchanges: all the pipeline moves off the training thread), the CPU the ranks used over
their time (main thread + gloo's threads: near the cores a rank can have means no room for overlap), the load
average before / after, and whether the pipelined DMPs' weights are bit-identical to the plain loop's at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

DENSE_IN, WARMUP = 16, 5
INPUT_SIDE = ("metadata", "input_dist")  # the collectives the pipeline sends ahead


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one step trains: tables of rows x dim (one feature each), ~mean_ids ids per bag, batch per rank."""

    name: str
    tables: int
    rows: int
    dim: int
    batch: int
    mean_ids: int
    sharding: str  # "table_wise" (tables alternate between the ranks) or "row_wise" (one row block per rank)

    def describe(self) -> str:
        return (f"{self.tables} tables of {self.rows:,} x {self.dim} ({self.sharding.upper()}, fused Adagrad), "
                f"~{self.mean_ids} ids per bag, batch {self.batch} per rank")


WORKLOADS = {
    "base": Workload("base", tables=8, rows=20_000, dim=8, batch=512, mean_ids=32, sharding="table_wise"),
    "comm": Workload("comm", tables=16, rows=20_000, dim=8, batch=256, mean_ids=64, sharding="row_wise"),
}


class Model(nn.Module):
    """EmbeddingBagCollection + a small dense part; forward(batch) -> (loss, loss), TorchRec's pipeline contract."""

    def __init__(self, workload: Workload) -> None:
        super().__init__()
        import rectoolkit as rtk

        tables = [rtk.EmbeddingBagConfig(name=f"t{t}", num_embeddings=workload.rows, embedding_dim=workload.dim,
                                         feature_names=[f"f{t}"]) for t in range(workload.tables)]
        self.ebc = rtk.EmbeddingBagCollection(tables, optimizer="adagrad", lr=0.05)
        self.dense = nn.Linear(DENSE_IN, workload.dim)
        self.over = nn.Linear(workload.dim * (workload.tables + 1), 1)

    def forward(self, batch):
        pooled = self.ebc(batch.sparse_features).values()
        logits = self.over(torch.cat([torch.relu(self.dense(batch.dense_features)), pooled], 1)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, loss.detach()


def make_batches(workload: Workload, num: int, rank: int) -> List:
    from rectoolkit.sparse import KeyedJaggedTensor
    from rectoolkit.train.data import Batch

    g = torch.Generator().manual_seed(1000 + rank)
    keys = [f"f{t}" for t in range(workload.tables)]
    out = []
    for _ in range(num):
        lengths = torch.randint(0, 2 * workload.mean_ids + 1, (workload.tables * workload.batch,), generator=g)
        values = torch.randint(0, workload.rows, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys, values, lengths)
        out.append(Batch(torch.randn(workload.batch, DENSE_IN, generator=g), kjt,
                         (torch.rand(workload.batch, generator=g) > 0.5).float()))
    return out


def table_plan(workload: Workload, table: int, world_size: int):
    from rectoolkit.plan.types import ParameterSharding, ShardMetadata

    rows, dim = workload.rows, workload.dim
    if workload.sharding == "table_wise":
        owner = table % world_size
        return ParameterSharding("table_wise", ranks=[owner], shards=[ShardMetadata.on_rank(owner, 0, 0, rows, dim)])
    if workload.sharding == "row_wise":
        block = -(-rows // world_size)
        shards = [ShardMetadata.on_rank(r, r * block, 0, min(block, rows - r * block), dim) for r in range(world_size)]
        return ParameterSharding("row_wise", ranks=list(range(world_size)), shards=shards)
    raise ValueError(f"workload {workload.name!r}: sharding {workload.sharding!r} is not table_wise or row_wise")


def build(workload: Workload, world_size: int):
    from rectoolkit.distributed import DistributedModelParallel
    from rectoolkit.plan.types import ShardingPlan

    torch.manual_seed(0)
    plan = {f"t{t}": table_plan(workload, t, world_size) for t in range(workload.tables)}
    dmp = DistributedModelParallel(Model(workload), plan=ShardingPlan({"ebc": plan}))
    dense = torch.optim.Adam(dmp.dense_parameters(), lr=0.01)
    return dmp, dense


def worker(rank: int, world_size: int, init_file: str, rounds: int, steps: int, out_file: str,
           workload: dict, threads: int, binding: str) -> None:
    from rectoolkit.launch.affinity import bind_this_process, rank_cpus

    bind_this_process(rank_cpus(rank, world_size, binding))  # before gloo starts its threads
    torch.set_num_threads(threads)
    workload = Workload(**workload)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    from rectoolkit.distributed import TrainPipelineSparseDist, full_state_dict

    total = WARMUP + rounds * steps
    batches = make_batches(workload, total + 2, rank)
    plain_dmp, plain_opt = build(workload, world_size)
    plain_feed = iter(batches[:total])

    def plain_step() -> None:
        batch = next(plain_feed)
        plain_opt.zero_grad()
        loss, _ = plain_dmp(batch)
        loss.backward()
        plain_opt.step()

    # the plain loop's whole input_dist (split, id check, routing, both exchanges), timed where forward runs it
    # (the split of the KJT, then each group's input_dist)
    input_dist_s = [0.0]

    def timed_call(run):
        def timed_run(*args):
            started = time.perf_counter()
            out = run(*args)
            input_dist_s[0] += time.perf_counter() - started
            return out
        return timed_run

    for collection in plain_dmp.sharded_modules.values():
        collection._batch_and_received = timed_call(collection._batch_and_received)
        for group in collection.groups.values():
            group.input_dist = timed_call(group.input_dist)

    contenders = {"plain": (plain_step, plain_dmp)}
    pipelines = []
    for name, background in (("pipelined", True), ("inline", False)):
        dmp, optimizer = build(workload, world_size)
        pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), background_input_dist=background)
        feed = iter(batches[:total])
        contenders[name] = (lambda pipeline=pipeline, feed=feed: pipeline.progress(feed), dmp)
        pipelines.append((pipeline, feed, dmp))

    def counters(env) -> List[float]:
        """wall, process CPU (all threads), blocked in input_dist, blocked in the other sharded collectives, the
        plain loop's input_dist end to end."""
        waits = env.stats.wait_s
        input_side = sum(waits.get(name, 0.0) for name in INPUT_SIDE)
        return [time.perf_counter(), time.process_time(), input_side, env.stats.total_wait_s() - input_side,
                input_dist_s[0]]

    def timed(step, count: int, env) -> tuple:
        """(seconds of the slowest rank; the ranks' shares of their time in CPU, input_dist waits, other waits,
        input_dist end to end)."""
        dist.barrier()
        before = counters(env)
        for _ in range(count):
            step()
        used = torch.tensor([a - b for a, b in zip(counters(env), before)], dtype=torch.float64)
        slowest, summed = used.clone(), used.clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dist.all_reduce(summed)  # over ranks
        return (float(slowest[0]), *(float(summed[k]) / float(summed[0]) for k in (1, 2, 3, 4)))

    for step, dmp in contenders.values():
        timed(step, WARMUP, dmp.env)
    results: Dict[str, list] = {f"{name}{part}": [] for name in contenders
                                for part in ("", "_cpu", "_input_wait", "_other_wait", "_input_dist")}
    for _ in range(rounds):
        for name, (step, dmp) in contenders.items():
            seconds, cpu, input_wait, other_wait, input_dist = timed(step, steps, dmp.env)
            results[name + "_input_dist"].append(input_dist)
            results[name].append(steps / seconds)
            results[name + "_cpu"].append(cpu)
            results[name + "_input_wait"].append(input_wait)
            results[name + "_other_wait"].append(other_wait)
    plain_state, identical = full_state_dict(plain_dmp), True
    for pipeline, feed, dmp in pipelines:
        try:  # a pipeline trains on the batch it holds last: run it out so every DMP saw every batch
            while True:
                pipeline.progress(feed)
        except StopIteration:
            pass
        state = full_state_dict(dmp)
        identical = identical and all(torch.equal(v, state[k]) for k, v in plain_state.items())
    if rank == 0:
        torch.save({**results, "identical": identical, "steps_trained": total}, out_file)
    dist.barrier()
    dist.destroy_process_group()


def median(values: List[float]) -> float:
    return statistics.median(values)


def summary(values: List[float]) -> str:
    return f"{median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def run_once(workload: Workload, rounds: int, steps: int, threads: int, binding: str = "none") -> Dict:
    """One spawn of the 2 ranks (bound to cores as `binding` says): their results, with the load average."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "results.pt")
        mp.start_processes(worker, args=(2, os.path.join(tmp, "rdzv"), rounds, steps, out_file,
                                         dataclasses.asdict(workload), threads, binding),
                           nprocs=2, join=True, start_method="spawn")
        results = torch.load(out_file)
    results["load"] = (load_before, os.getloadavg())
    results["binding"] = binding
    results["ratios"] = [p / q for p, q in zip(results["pipelined"], results["plain"])]
    results["inline_ratios"] = [p / q for p, q in zip(results["inline"], results["plain"])]
    return results


def comm_share(results: Dict, name: str) -> str:
    """Blocked in collectives / time, medians over the rounds: total (input_dist + the rest)."""
    inputs, others = results[name + "_input_wait"], results[name + "_other_wait"]
    total = median([i + o for i, o in zip(inputs, others)])
    return f"{total:.0%} ({median(inputs):.0%} + {median(others):.0%})"


def ratio(values: List[float]) -> str:
    return f"{median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def row(run: int, results: Dict) -> str:
    before, after = results["load"]
    return (f"| {run} | {summary(results['plain'])} | {summary(results['pipelined'])} | {ratio(results['ratios'])} | "
            f"{ratio(results['inline_ratios'])} | {comm_share(results, 'plain')} | "
            f"{median(results['plain_input_dist']):.0%} | {comm_share(results, 'pipelined')} | "
            f"{median(results['plain_cpu']):.2f} / {median(results['pipelined_cpu']):.2f} | "
            f"{before[0]:.1f} / {after[0]:.1f} | {'yes' if results['identical'] else 'NO'} |")


def workload_section(workload: Workload, results: List[Dict], rounds: int, steps: int,
                     binding: str = "none") -> List[str]:
    all_ratios = [r for result in results for r in result["ratios"]]
    all_inline = [r for result in results for r in result["inline_ratios"]]
    plain_comm = median([median([i + o for i, o in zip(r["plain_input_wait"], r["plain_other_wait"])])
                         for r in results])
    plain_input_dist = median([median(r["plain_input_dist"]) for r in results])
    return [
        f"## workload `{workload.name}`: {workload.describe()}"
        + ("" if binding == "none" else ", each rank bound to its own core (cpu_binding='auto')"),
        "",
        f"{len(results)} runs; each: {rounds} alternating rounds of {steps} steps after {WARMUP} warm-up steps.",
        "",
        "| run | plain steps/s | pipelined steps/s | ratio | ratio, inline | plain comm share (input_dist + rest) | "
        "plain input_dist share | pipelined comm share | CPU per rank plain / pipelined | load | identical |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *[row(k + 1, result) for k, result in enumerate(results)],
        "",
        f"All rounds of all runs: median ratio {median(all_ratios):.2f}x, "
        f"{sum(r >= 1.2 for r in all_ratios)} of {len(all_ratios)} rounds at 1.2x or more (inline: "
        f"{median(all_inline):.2f}x); the plain loop's communication share (median of the runs) {plain_comm:.0%}, "
        f"its input_dist end to end {plain_input_dist:.0%}.",
        "",
    ]


def binding_comparison(results: Dict[str, List[Dict]]) -> List[str]:
    """Bound / unbound steps/s of each loop, run by run (the runs alternated, so run k of each saw alike load)."""
    cells = []
    for loop in ("plain", "pipelined"):
        per_run = [median(bound[loop]) / median(free[loop]) for free, bound in zip(results["none"], results["auto"])]
        cells.append(f"{loop} {ratio(per_run)}")
    return [f"Bound / unbound steps/s, median (range) over the run pairs: {'; '.join(cells)}.", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="one run of 7 rounds of 8 steps per workload")
    parser.add_argument("--no-write", action="store_true", help="print the table only (no results/pipeline.md)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank (torch.set_num_threads)")
    parser.add_argument("--runs", type=int, default=3, help="spawns of the 2 ranks per workload, one after the other")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, help="samples per rank per step (overrides the workload's)")
    parser.add_argument("--ids", type=int, help="mean ids per bag (overrides the workload's)")
    parser.add_argument("--tables", type=int, help="tables, one feature each (overrides the workload's)")
    parser.add_argument("--dim", type=int, help="embedding dim (overrides the workload's)")
    parser.add_argument("--sharding", choices=["table_wise", "row_wise"], help="(overrides the workload's)")
    parser.add_argument("--cpu-binding", choices=["none", "auto", "both"], default="none",
                        help="bind each rank to its own share of the cores (rectoolkit.launch.affinity); both: "
                             "runs alternate unbound / bound and each gets its table")
    args = parser.parse_args()
    runs, rounds, steps = (1, 7, 8) if args.quick else (args.runs, args.rounds, args.steps)
    chosen = list(WORKLOADS.values()) if args.workload == "all" else [WORKLOADS[args.workload]]
    overrides = {"batch": args.batch, "mean_ids": args.ids, "tables": args.tables, "dim": args.dim,
                 "sharding": args.sharding}
    chosen = [dataclasses.replace(w, **{k: v for k, v in overrides.items() if v is not None}) for w in chosen]
    lines = [
        "# bench_pipeline",
        "",
        f"TrainPipelineSparseDist vs the plain loop, 2 CPU ranks (gloo), {args.threads} intra-op thread(s) each, a "
        f"small dense part (Adam, DDP). torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, "
        f"fbgemm {'off' if os.environ.get('RECTOOLKIT_DISABLE_FBGEMM') == '1' else 'when installed'}. "
        "steps/s of the slowest rank, median (range over the rounds); ratio = median (range) of the per-round ratios "
        "pipelined / plain; inline: the pipeline with background_input_dist=False (the next batches' input_dist "
        "work on the training thread, not on the pipeline's own). Comm share = time the ranks spent blocked in the "
        "sharded modules' collectives / their time (DDP's all-reduce not counted), median over the rounds: the "
        "input_dist part (sizes + ids all-to-all) + the rest (output_dist and its backward). Plain input_dist share = "
        "the plain loop's whole input_dist (split, id check, routing, both exchanges; timed around it in forward) / "
        "its time: all that the pipeline takes off the training thread. CPU per rank = process CPU time (main thread, "
        "gloo's and the pipeline's threads) / wall time. Load = 1-minute load average before / after the run. "
        "Identical = the pipelined DMPs' weights equal the plain loop's bit for bit at the end of the run "
        "(all trained on the same batches).",
        "",
    ]
    bindings = ["none", "auto"] if args.cpu_binding == "both" else [args.cpu_binding]
    for workload in chosen:
        results: Dict[str, List[Dict]] = {binding: [] for binding in bindings}
        for _ in range(runs):
            for binding in bindings:  # alternating, so that the machine's load hits both alike
                results[binding].append(run_once(workload, rounds, steps, args.threads, binding))
        for binding in bindings:
            lines += workload_section(workload, results[binding], rounds, steps, binding)
            print("\n".join(lines[-(runs + 9):]), file=sys.stderr, flush=True)  # progress while the rest runs
        if len(bindings) == 2:
            lines += binding_comparison(results)
    text = "\n".join(lines).rstrip()
    print(text)
    if not (args.quick or args.no_write):
        path = Path(__file__).parent / "results" / "pipeline.md"
        path.write_text(text + "\n")
        print(f"\nwritten to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
