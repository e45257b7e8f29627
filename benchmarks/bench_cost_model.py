"""Does the planner's step-time estimate predict measured step time? (issue 11)

    .venv/bin/python benchmarks/bench_cost_model.py              # writes benchmarks/results/cost_model.md (+ _raw.json)
    .venv/bin/python benchmarks/bench_cost_model.py --quick      # fewer steps and rounds, one repeat
    .venv/bin/python benchmarks/bench_cost_model.py --repeats 3 --workloads issue8
    .venv/bin/python benchmarks/bench_cost_model.py --reestimate benchmarks/results/cost_model_raw.json
    .venv/bin/python benchmarks/bench_cost_model.py --reestimate benchmarks/results/*_raw.json --profile a.json --profile b.json
    .venv/bin/python benchmarks/bench_cost_model.py --replay benchmarks/results/cost_distinct_rows_*_raw.json --rounds 10 --steps 10
    .venv/bin/python benchmarks/bench_cost_model.py --replicas --rounds 10 --steps 16

Per workload, at least 8 diverse plans (all table-wise, all row-wise, all column-wise, table-row-wise,
grid-shard, data-parallel, everything on rank 0, a hand-mixed plan, the planner's own plan and TorchRec 1.8's
plan, read with rectoolkit.plan.torchrec_interop.from_torchrec) are run on 2 local CPU ranks (gloo, one torch
thread each, fused SGD) by `rectoolkit.planner.measure_plans`: one launch per workload and repeat, the plans
alternating round by round so that machine load hits all alike. Each repeat calibrates the Topology afresh
(`make_topology`), as a user would.

Reported per workload and repeat: Spearman rank correlation between estimated and measured step time (all
plans; and without data_parallel and rank0, the plans a user would not weigh), the median of
|measured / estimated - 1|, a least-squares fit measured = a + b * estimated (with R^2), the planner's plan
measured against the measured-fastest plan and against TorchRec's plan, and the load average. Then the
planner's plan runs again head to head against TorchRec's and the measured-fastest (`--head-to-head` rounds,
a second launch with only those plans, and with a copy of the planner's plan as a control): a few percent
between two plans is within what the ten-plan run's four rounds resolve, so the planner's targets are read from
the per-round ratios there, beside the planner's plan against its own copy (what the head to head reads for two
equal plans: its resolution on this machine at this load). Measured step
time = median over timed steps of the slowest rank's wall time (each step starts on a barrier); estimated =
the plan's `est_step_ms` (rectoolkit.planner.measure.estimate_plan: the cost model's step estimate). The raw per-plan, per-rank,
per-step measurements go to benchmarks/results/cost_model_raw.json, for fitting the model's terms;
`--reestimate` prices those measured plans again with the cost model as it is now, without running anything (with
the calibration each run measured with; `--recalibrate`: a fresh one).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd
import torch

import rectoolkit as rtk
from rectoolkit.plan.serialization import plan_to_dict
from rectoolkit.plan.types import EmbeddingComputeKernel, ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.planner import EmbeddingShardingPlanner, Topology, measure_plans
from rectoolkit.planner.enumerate import row_blocks
from rectoolkit.planner.load import load_factors
from rectoolkit.planner.stats import WorkloadStats
from rectoolkit.workloads import load_workload

HERE = Path(__file__).resolve().parent
WORLD_SIZE = 2
UNWEIGHED = ("data_parallel", "rank0")  # deliberately bad / off-scale plans, left out of the "core" Spearman


@dataclasses.dataclass
class Workload:
    name: str
    about: str
    tables: List[rtk.EmbeddingBagConfig]
    pooling_factors: Dict[str, float]
    batch_size: int
    zipf_alpha: float


def issue8() -> Workload:
    """The issue's workload: 8 tables of 20k-200k rows, dims 16-128, pooling factors 1-50, batch 512 per rank."""
    shapes = [(20_000, 128, 50.0), (200_000, 16, 1.0), (50_000, 64, 10.0), (100_000, 32, 20.0),
              (150_000, 128, 2.0), (30_000, 16, 30.0), (80_000, 64, 5.0), (120_000, 32, 40.0)]
    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"])
              for i, (rows, dim, _) in enumerate(shapes)]
    factors = {f"f{i}": pf for i, (_, _, pf) in enumerate(shapes)}
    return Workload("issue8", "8 tables, 20k-200k rows, dims 16-128, pooling factors 1-50, uniform ids, batch 512/rank",
                    tables, factors, 512, 0.0)


def dlrm26_cut(max_rows: int = 100_000, batch_size: int = 512) -> Workload:
    """dlrm26 (26 Criteo-like tables, dim 64, Zipf ids) with rows capped at `max_rows`, batch 512 per rank."""
    workload = load_workload("dlrm26")
    tables = [dataclasses.replace(t, num_embeddings=min(t.num_embeddings, max_rows)) for t in workload.tables]
    alpha = float(workload.id_distribution.get("alpha", 0.0)) if workload.id_distribution.get("kind") == "zipf" else 0.0
    return Workload("dlrm26_100k", f"dlrm26, rows capped at {max_rows:,}, dim 64, Zipf alpha {alpha}, "
                    f"batch {batch_size}/rank", tables, dict(workload.pooling_factors), batch_size, alpha)


WORKLOADS: Dict[str, Callable[[], Workload]] = {"issue8": issue8, "dlrm26_100k": dlrm26_cut}


# ------------------------------------------------------------------------------------------ topology
def make_topology(world_size: int) -> Topology:
    """The Topology the planner and the estimates use: calibrated on this machine (the one call to change when
    calibration changes)."""
    return Topology.calibrate(world_size=world_size, compute_device="cpu")


# ------------------------------------------------------------------------------------------ plans
def _shard(rank: int, row: int, col: int, rows: int, cols: int) -> ShardMetadata:
    return ShardMetadata.on_rank(rank, row, col, rows, cols)


def _sharding(kind: str, shards: List[ShardMetadata], kernel: str = "fused") -> ParameterSharding:
    return ParameterSharding(kind, kernel, ranks=sorted({s.rank for s in shards}), shards=shards)


def _table_wise_greedy(workload: Workload, W: int) -> Dict[str, int]:
    """Table -> rank: bytes read per sample (pooling factor x dim) balanced greedily, largest first."""
    work = {t.name: workload.pooling_factors[t.feature_names[0]] * t.embedding_dim for t in workload.tables}
    load = [0.0] * W
    owner = {}
    for name in sorted(work, key=lambda n: -work[n]):
        rank = int(np.argmin(load))
        owner[name] = rank
        load[rank] += work[name]
    return owner


def _row_wise(t: rtk.EmbeddingBagConfig, ranks: List[int], col: int = 0, cols: Optional[int] = None) -> List[ShardMetadata]:
    cols = t.embedding_dim if cols is None else cols
    return [_shard(r, offset, col, size, cols) for r, (offset, size) in zip(ranks, row_blocks(t.num_embeddings, len(ranks)))]


def _column_wise(t: rtk.EmbeddingBagConfig, W: int, first_rank: int) -> List[ShardMetadata]:
    blocks = W if t.embedding_dim % (4 * W) == 0 else 1
    width = t.embedding_dim // blocks
    return [_shard((first_rank + k) % W, 0, k * width, t.num_embeddings, width) for k in range(blocks)]


def hand_plans(workload: Workload, W: int) -> Dict[str, ShardingPlan]:
    """The fixed plans: the same whatever the cost model says, so that runs compare."""
    ranks = list(range(W))
    owner = _table_wise_greedy(workload, W)
    plans: Dict[str, Dict[str, ParameterSharding]] = {k: {} for k in (
        "table_wise", "row_wise", "column_wise", "table_row_wise", "grid_shard", "data_parallel", "rank0", "mixed")}
    by_rows = sorted(workload.tables, key=lambda t: -t.num_embeddings)
    hottest = max(workload.tables, key=lambda t: workload.pooling_factors[t.feature_names[0]] * t.embedding_dim)
    for index, t in enumerate(workload.tables):
        R, D = t.num_embeddings, t.embedding_dim
        plans["table_wise"][t.name] = _sharding("table_wise", [_shard(owner[t.name], 0, 0, R, D)])
        plans["row_wise"][t.name] = _sharding("row_wise", _row_wise(t, ranks))
        plans["column_wise"][t.name] = _sharding("column_wise", _column_wise(t, W, index))
        plans["table_row_wise"][t.name] = _sharding("table_row_wise", _row_wise(t, ranks))
        half = D // 2 if D % 8 == 0 else D
        grid = [s for k, c in enumerate(range(0, D, half)) for s in _row_wise(t, ranks, c, half)]
        plans["grid_shard"][t.name] = _sharding("grid_shard", grid)
        plans["data_parallel"][t.name] = _sharding("data_parallel", [_shard(r, 0, 0, R, D) for r in ranks],
                                                   EmbeddingComputeKernel.DENSE.value)
        plans["rank0"][t.name] = _sharding("table_wise", [_shard(0, 0, 0, R, D)])
        # mixed: the largest table row-wise, the hottest column-wise, the rest table-wise
        if t is by_rows[0]:
            plans["mixed"][t.name] = plans["row_wise"][t.name]
        elif t is hottest:
            plans["mixed"][t.name] = plans["column_wise"][t.name]
        else:
            plans["mixed"][t.name] = plans["table_wise"][t.name]
    return {name: ShardingPlan({"": plan}) for name, plan in plans.items()}


def planner_plan(workload: Workload, topology: Topology) -> ShardingPlan:
    stats = WorkloadStats(dict(workload.pooling_factors), workload.batch_size)
    return EmbeddingShardingPlanner(topology, batch_size=workload.batch_size, stats=stats).plan(workload.tables)


def torchrec_plan(workload: Workload, W: int) -> ShardingPlan:
    """TorchRec 1.8's planner on the same tables, pooling factors and batch (CPU topology), read as ours."""
    import torchrec
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner as TorchRecPlanner
    from torchrec.distributed.planner import Topology as TorchRecTopology
    from torchrec.distributed.planner.types import ParameterConstraints

    from rectoolkit.plan.torchrec_interop import from_torchrec

    tables = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                          feature_names=list(t.feature_names)) for t in workload.tables]
    constraints = {t.name: ParameterConstraints(pooling_factors=[workload.pooling_factors[f] for f in t.feature_names])
                   for t in workload.tables}
    planner = TorchRecPlanner(topology=TorchRecTopology(world_size=W, compute_device="cpu"),
                              batch_size=workload.batch_size, constraints=constraints)
    plan = planner.plan(torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
                        [EmbeddingBagCollectionSharder()])
    return from_torchrec(plan, workload.tables, compute_device="cpu", local_world_size=W)


def candidate_plans(workload: Workload, topology: Topology, W: int) -> Tuple[Dict[str, ShardingPlan], Dict[str, str]]:
    """(name -> plan, name -> why it is missing) for every plan of the comparison."""
    plans = hand_plans(workload, W)
    missing = {}
    plans["planner"] = planner_plan(workload, topology)
    try:
        plans["torchrec"] = torchrec_plan(workload, W)
    except Exception as error:  # TorchRec missing or refusing: recorded in the table, not hidden
        missing["torchrec"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return plans, missing


# ------------------------------------------------------------------------------------------ statistics
def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties): Pearson's r of the ranks."""
    def ranks(values: np.ndarray) -> np.ndarray:
        order = np.argsort(values, kind="mergesort")
        out = np.empty(len(values))
        out[order] = np.arange(len(values), dtype=float)
        for value in np.unique(values):  # ties share their mean rank
            same = values == value
            out[same] = out[same].mean()
        return out

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3:
        return float("nan")
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def summarize(frame) -> Dict[str, Any]:
    """The comparison's figures from PlanMeasurements.plans (columns plan, est_step_ms, step_ms)."""
    est = frame.est_step_ms.to_numpy(float)
    measured = frame.step_ms.to_numpy(float)
    cpu = frame.cpu_ms.to_numpy(float)
    names = list(frame.plan)
    core = np.array([n not in UNWEIGHED for n in names])
    slope, intercept = np.polyfit(est, measured, 1)
    fitted = intercept + slope * est
    r2 = 1 - ((measured - fitted) ** 2).sum() / max(((measured - measured.mean()) ** 2).sum(), 1e-12)
    by_name = dict(zip(names, measured))
    fastest = names[int(np.argmin(measured))]
    out = {
        "plans": len(names),
        "spearman_all": spearman(est, measured),
        "spearman_core": spearman(est[core], measured[core]),
        "median_abs_error": float(np.median(np.abs(measured / est - 1))),
        "spearman_all_cpu": spearman(est, cpu), "spearman_core_cpu": spearman(est[core], cpu[core]),
        "median_abs_error_cpu": float(np.median(np.abs(cpu / est - 1))),
        "spearman_all_min": spearman(est, frame.step_ms_min.to_numpy(float)),
        "fit_a_ms": float(intercept), "fit_b": float(slope), "fit_r2": float(r2),
        "fastest": fastest, "fastest_ms": float(by_name[fastest]),
        "planner_ms": float(by_name["planner"]), "planner_est_ms": float(dict(zip(names, est))["planner"]),
        "planner_vs_fastest": float(by_name["planner"] / by_name[fastest]),
    }
    if "torchrec" in by_name:
        out["planner_vs_torchrec"] = float(by_name["planner"] / by_name["torchrec"])
    if "est_now_ms" in frame:  # the estimate at the load probed before the plans ran (measure_plans)
        now = frame.est_now_ms.to_numpy(float)
        out["median_abs_error_now"] = float(np.median(np.abs(measured / now - 1)))
        out["median_abs_error_now_core"] = float(np.median(np.abs(measured[core] / now[core] - 1)))
        out["spearman_now_all"] = spearman(now, measured)
        out["spearman_now_core"] = spearman(now[core], measured[core])
        during = frame.est_during_ms.to_numpy(float)
        out["median_abs_error_during"] = float(np.median(np.abs(measured / during - 1)))
    return out


# ------------------------------------------------------------------------------------------ main
def measure_workload(plans: Dict[str, ShardingPlan], workload: Workload, **options: Any):
    """measure_plans of `plans` on `workload`'s tables, batch, pooling factors and ids (`options`: steps, rounds, ...)."""
    return measure_plans(plans, workload.tables, WORLD_SIZE, batch_size=workload.batch_size,
                         pooling_factors=workload.pooling_factors, zipf_alpha=workload.zipf_alpha, **options)


def run(args) -> List[Dict[str, Any]]:
    runs = []
    for repeat in range(args.repeats):
        topology = make_topology(WORLD_SIZE)
        for name in args.workloads:
            workload = WORKLOADS[name]()
            plans, missing = candidate_plans(workload, topology, WORLD_SIZE)
            started = time.perf_counter()
            result = measure_workload(plans, workload, steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                                      phase_steps=args.phase_steps, topology=topology, num_threads=args.threads)
            summary = summarize(result.plans)
            summary.update(workload=name, repeat=repeat, seconds=round(time.perf_counter() - started, 1),
                           load_before=result.info["load_average_before"][0],
                           load_after=result.info["load_average_after"][0],
                           load_factor=result.info["load_probe_before"]["factor"],
                           load_factor_during=result.info["load_probe_during"]["factor"],
                           load_factor_alone=load_factors(result.info["load_probe_before"])[1],
                           load_factor_alone_during=load_factors(result.info["load_probe_during"])[1],
                           bytes_exact=bool(result.plans.bytes_exact.all()),
                           memory_exact=bool(result.plans.memory_exact.all()), missing=missing)
            if args.head_to_head:
                summary.update(head_to_head(plans, summary["fastest"], workload, topology, args))
            print(f"\n{name} repeat {repeat}: {json.dumps(summary, default=str)}", file=sys.stderr, flush=True)
            print(result.plans.to_string(index=False), file=sys.stderr, flush=True)
            runs.append({"workload": name, "about": workload.about, "repeat": repeat, "summary": summary,
                         "topology": result.info["topology"],
                         "tables": [{"name": t.name, "num_embeddings": t.num_embeddings,
                                     "embedding_dim": t.embedding_dim, "feature_names": list(t.feature_names),
                                     "pooling": t.pooling.value} for t in workload.tables],
                         "pooling_factors": workload.pooling_factors, "zipf_alpha": workload.zipf_alpha,
                         "plans": {k: plan_to_dict(p) for k, p in plans.items()},
                         "measurements": result.to_dict()})
    return runs


def per_round(result) -> pd.DataFrame:
    """Rounds x plans: each round's median step (the slowest rank's wall time) of measure_plans' result."""
    per_step = result.steps.groupby(["plan", "round", "step"])["wall_ms"].max()
    return per_step.groupby(["plan", "round"]).median().unstack(0)


COPY = "planner (copy)"  # the head to head's control: the planner's plan again, as a plan of its own


def head_to_head(plans: Dict[str, ShardingPlan], fastest: str, workload: Workload, topology: Topology,
                 args) -> Dict[str, Any]:
    """The planner's plan against TorchRec's and the measured-fastest, alone in a second launch for
    `args.head_to_head` alternating rounds: a few percent between two plans in the ten-plan run is within what
    four rounds resolve. Per rival: the median, min and max over rounds of the planner's step / the rival's
    (paired by round, so a burst of load slows both alike) and the rounds the planner was slower.

    The launch also runs COPY, a second sharded model of the planner's very plan (built and timed as any other
    plan), reported as a rival: the planner's step over its own copy is what the head to head reads for two equal
    plans, so a ratio to TorchRec's within that distance of 1 is not a difference this run can tell."""
    rivals = [n for n in dict.fromkeys(("torchrec", fastest)) if n in plans and n != "planner"
              and plan_to_dict(plans[n])["plan"] != plan_to_dict(plans["planner"])["plan"]]
    if not rivals:
        return {"head_to_head": {}}
    rivals.append(COPY)
    chosen = {n: plans[n] for n in ["planner"] + rivals[:-1]}
    chosen[COPY] = copy.deepcopy(plans["planner"])
    result = measure_workload(chosen, workload, steps=args.steps, warmup=args.warmup, rounds=args.head_to_head,
                              phase_steps=0, topology=topology, num_threads=args.threads)
    rounds = per_round(result)
    out = {}
    for rival in rivals:
        ratio = rounds["planner"] / rounds[rival]
        out[rival] = {"median": float(ratio.median()), "min": float(ratio.min()), "max": float(ratio.max()),
                      "slower_rounds": int((ratio > 1).sum()), "rounds": int(len(ratio))}
    return {"head_to_head": out}


def head_to_head_cell(summary: Dict[str, Any], rival: str) -> str:
    """'0.98x [0.91, 1.04], 3/10 slower'; 'same plan' where the rival's plan is the planner's; '-' where not run
    (COPY: where the head to head did not run, having no rival)."""
    if "head_to_head" not in summary or rival in summary.get("missing", {}):
        return "-"
    h = summary["head_to_head"].get(rival)
    if h is None:
        return "-" if rival == COPY else "same plan"  # no rival to run: no control either
    return f"{h['median']:.2f}x [{h['min']:.2f}, {h['max']:.2f}], {h['slower_rounds']}/{h['rounds']} slower"


def report(runs: List[Dict[str, Any]], raw_name: str = "cost_model_raw.json") -> str:
    first = runs[0]["measurements"]["info"]
    lines = [
        f"Estimated vs measured step time of {runs[0]['summary']['plans']}+ plans per workload on {WORLD_SIZE} local CPU "
        f"ranks (gloo, {first['num_threads']} torch thread(s) each, fused SGD), measured by "
        f"rectoolkit.planner.measure_plans: {first['warmup']} warm-up steps, {first['rounds']} alternating rounds of "
        f"{first['steps']} timed steps per plan "
        f"(measured = median of the slowest rank's wall time per step; estimated = the cost model's step "
        f"estimate, est_step_ms, on a quiet machine; 'now' = est_now_ms, the same at the load the run probed "
        f"before its first timed step, rectoolkit.planner.load; 'during' = the same with the load probed between the "
        f"plans' blocks, which tells a wrong model from a load that moved). Topology calibrated afresh for each repeat (Topology.calibrate). torch {torch.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} cores. 'core' = without data_parallel and rank0; 'vs CPU ms', "
        f"'CPU/est' = the same figures against the busiest rank's process CPU time per step, which machine load "
        f"inflates less than wall time; 'exact' = bytes and memory measured == estimated on every rank of every plan.",
        "",
        "| workload | repeat | load avg | load factor before / during (one rank working) | Spearman all | Spearman core "
        "| Spearman all / core at now | median \\|meas/now - 1\\| (core) | median \\|meas/during - 1\\| | median \\|meas/est - 1\\| | fit a (ms) | fit b | R^2 | fastest plan | planner / fastest "
        "| planner / TorchRec | head to head: planner / TorchRec | head to head: planner / fastest "
        "| head to head: planner / its copy (two equal plans) "
        "| Spearman all / core vs CPU ms | median \\|CPU/est - 1\\| | bytes, memory exact |",
        "| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for run_ in runs:
        s = run_["summary"]
        torchrec = f"{s['planner_vs_torchrec']:.2f}x" if "planner_vs_torchrec" in s else s["missing"].get("torchrec", "-")
        exact = "yes" if s["bytes_exact"] and s["memory_exact"] else f"bytes {s['bytes_exact']}, memory {s['memory_exact']}"
        factor = f"{s['load_factor']:.2f} / {s['load_factor_during']:.2f}" if "load_factor" in s else "-"
        if "load_factor_alone" in s:
            factor += f" ({s['load_factor_alone']:.2f} / {s['load_factor_alone_during']:.2f} alone)"
        at_now = (f"{s['spearman_now_all']:.2f} / {s['spearman_now_core']:.2f}" if "spearman_now_all" in s else "-")
        now = (f"{100 * s['median_abs_error_now']:.0f}% ({100 * s['median_abs_error_now_core']:.0f}%)"
               if "median_abs_error_now" in s else "-")
        during = f"{100 * s['median_abs_error_during']:.0f}%" if "median_abs_error_during" in s else "-"
        lines.append(f"| {s['workload']} | {s['repeat']} | {s['load_before']:.1f} -> {s['load_after']:.1f} "
                     f"| {factor} | {s['spearman_all']:.2f} | {s['spearman_core']:.2f} | {at_now} | {now} | {during} "
                     f"| {100 * s['median_abs_error']:.0f}% "
                     f"| {s['fit_a_ms']:.1f} | {s['fit_b']:.3f} | {s['fit_r2']:.2f} | {s['fastest']} "
                     f"| {s['planner_vs_fastest']:.2f}x | {torchrec} | {head_to_head_cell(s, 'torchrec')} "
                     f"| {head_to_head_cell(s, s['fastest'])} | {head_to_head_cell(s, COPY)} "
                     f"| {s['spearman_all_cpu']:.2f} / {s['spearman_core_cpu']:.2f} "
                     f"| {100 * s['median_abs_error_cpu']:.0f}% | {exact} |")
    lines += reproducibility(runs)
    lines += ["", "Per plan (estimated ms [at the probed load] / measured ms, slowest rank; CPU ms of the busiest "
              "rank in brackets):", ""]
    for name in dict.fromkeys(r["workload"] for r in runs):
        mine = [r for r in runs if r["workload"] == name]
        plans = [p["plan"] for p in mine[0]["measurements"]["plans"]]
        lines += [f"{name}: {mine[0]['about']}", "",
                  "| plan | " + " | ".join(f"repeat {r['repeat']}" for r in mine) + " |",
                  "| --- |" + " ---: |" * len(mine)]
        for plan in plans:
            cells = []
            for r in mine:
                row = next(p for p in r["measurements"]["plans"] if p["plan"] == plan)
                now = f" [{row['est_now_ms']:.1f}]" if "est_now_ms" in row else ""
                cells.append(f"{row['est_step_ms']:.1f}{now} / {row['step_ms']:.1f} ({row['cpu_ms']:.1f})")
            lines.append(f"| {plan} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += parts_table(runs)
    lines.append(f"Raw per-plan, per-rank, per-step measurements: benchmarks/results/{raw_name} "
                 f"(first run's settings: {json.dumps({k: first[k] for k in ('batch_size', 'steps', 'rounds', 'phase_steps', 'num_threads')})}).")
    return "\n".join(lines)


def reproducibility(runs: List[Dict[str, Any]]) -> List[str]:
    """How well the measurement ranks the plans the same way twice: Spearman between the measured step times
    of two repeats (the ceiling of any estimate's Spearman on this machine at this load), over the plans that
    are the same in both (the planner's may differ after a fresh calibration)."""
    lines = []
    for name in dict.fromkeys(r["workload"] for r in runs):
        mine = [r for r in runs if r["workload"] == name]
        pairs = []
        for first, second in zip(mine, mine[1:]):
            a, b = (pd.DataFrame(r["measurements"]["plans"]).set_index("plan") for r in (first, second))
            plans = [p for p in a.index if p in b.index and first["plans"][p] == second["plans"][p]]  # same plan
            core = [p for p in plans if p not in UNWEIGHED]
            cells = [spearman(a.loc[keep, column].to_numpy(float), b.loc[keep, column].to_numpy(float))
                     for column in ("step_ms", "cpu_ms") for keep in (plans, core)]
            pairs.append(f"repeats {first['repeat']} and {second['repeat']}: wall {cells[0]:.2f} (core {cells[1]:.2f}), "
                         f"CPU {cells[2]:.2f} (core {cells[3]:.2f})")
        if pairs:
            lines.append(f"- {name}: " + "; ".join(pairs))
    if not lines:
        return []
    return ["", "Measurement reproducibility, Spearman between the measured step times of consecutive repeats (the "
            "ceiling for any estimate at this load):", ""] + lines


def parts_table(runs: List[Dict[str, Any]]) -> List[str]:
    """Estimated vs measured parts of each plan (first repeat of each workload), the largest rank value of each:
    where the estimate goes wrong."""
    lines = ["Parts (first repeat; per part the largest value over ranks, ms; measured parts from the phase-timed "
             "steps, CPU time, so waiting for the other rank is not in them; est comm = all collectives):", "",
             "| workload | plan | est lookup fwd | meas lookup | est lookup bwd | meas backward (incl. bwd comm) "
             "| est comm | meas input_dist + output_dist | meas other fwd | collective calls / step |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for run_ in runs:
        if run_["repeat"] != 0:
            continue
        ranks = run_["measurements"]["ranks"]
        for plan in [p["plan"] for p in run_["measurements"]["plans"]]:
            mine = [r for r in ranks if r["plan"] == plan]
            top = lambda key: max(float(r.get(key) or 0.0) for r in mine)  # noqa: E731
            dist = max(float(r.get("input_dist_cpu_ms") or 0.0) + float(r.get("output_dist_cpu_ms") or 0.0) for r in mine)
            lines.append(f"| {run_['workload']} | {plan} | {top('est_lookup_fwd_ms'):.1f} | {top('lookup_cpu_ms'):.1f} "
                         f"| {top('est_lookup_bwd_ms'):.1f} | {top('backward_cpu_ms'):.1f} | {top('est_comm_ms'):.1f} "
                         f"| {dist:.1f} | {top('forward_other_cpu_ms'):.1f} | {int(top('collective_calls'))} |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=2, help="fresh calibration + launch per repeat")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per plan per round")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--phase-steps", type=int, default=1, help="phase-timed steps per plan per round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--head-to-head", type=int, default=10, metavar="ROUNDS",
                        help="then run the planner's plan against TorchRec's, the measured-fastest and a copy of "
                             "itself alone, for ROUNDS alternating rounds of --steps steps (0: not)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 2 rounds of 4 steps")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--name", default="cost_model",
                        help="write benchmarks/results/NAME.md and NAME_raw.json (default cost_model)")
    parser.add_argument("--reestimate", type=Path, nargs="+", metavar="RAW_JSON",
                        help="run nothing: recompute the estimates of raw files' plans with the current cost model "
                             "and print the comparison against their measurements (the planner's plan stays the "
                             "one that was measured), with the calibration each run measured with")
    parser.add_argument("--recalibrate", action="store_true",
                        help="with --reestimate: price with a fresh calibration of this machine instead")
    parser.add_argument("--profile", type=Path, action="append", metavar="PROFILE_JSON",
                        help="with --reestimate: price every stored run with this saved profile instead and print one "
                             "summary line per profile (repeat the option to compare calibrations)")
    parser.add_argument("--replay", type=Path, nargs="+", metavar="RAW_JSON",
                        help="run the planner's and TorchRec's plans stored in raw files again, head to head, for "
                             "each of --workloads (--rounds alternating rounds of --steps steps), and print the "
                             "ratio to TorchRec's plan round by round")
    parser.add_argument("--replicas", action="store_true",
                        help="run TorchRec's dlrm26_100k plan with 0, 1, 3, 6, 9 of its smallest tables replicated, "
                             "head to head (--rounds alternating rounds of --steps steps)")
    args = parser.parse_args()
    from cost_model_stored import profiles_on_stored_runs, reestimate, replay, replicas  # (they use this module)

    if args.replicas:
        print(replicas(args.rounds, args.steps))
        return
    if args.replay:
        for name in args.workloads:
            print(replay(args.replay, name, args.rounds, args.steps) + "\n")
        return
    if args.reestimate and args.profile:
        print(profiles_on_stored_runs(args.reestimate, args.profile))
        return
    if args.profile:
        parser.error("--profile prices stored runs: give them with --reestimate RAW_JSON [RAW_JSON ...]")
    if args.reestimate:
        if len(args.reestimate) > 1:
            parser.error("--reestimate without --profile prints one raw file's full comparison: give one file")
        args.reestimate = args.reestimate[0]
        print(f"Estimates recomputed now on the measurements of {args.reestimate}:\n")
        print(report(reestimate(args.reestimate, recalibrate=args.recalibrate), Path(args.reestimate).name))
        return
    if args.quick:
        args.repeats, args.rounds, args.steps, args.head_to_head = 1, 2, 4, min(args.head_to_head, 2)
    runs = run(args)
    table = report(runs, f"{args.name}_raw.json")
    print(table)
    if not args.no_write:
        results = HERE / "results"
        results.mkdir(exist_ok=True)
        (results / f"{args.name}.md").write_text("# bench_cost_model\n\n" + table + "\n")
        (results / f"{args.name}_raw.json").write_text(json.dumps({"runs": runs}, default=str))


if __name__ == "__main__":
    main()
