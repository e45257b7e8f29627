"""The sharding planner: planning time, plan quality, and TorchRec's planner side by side.

    .venv/bin/python benchmarks/bench_planner.py            # prints markdown tables
                                                            # and writes benchmarks/results/planner.md
    .venv/bin/python benchmarks/bench_planner.py --quick    # smaller grid, fewer quality instances

1. Planning time for 26 (dlrm26), 100, 500, 1000, 5000 tables (and 10,000) on 2, 8, 64, 512 ranks (8 ranks
   per host, cuda, 80 GiB HBM + 1 TiB host memory per rank, batch 2048), with the plan's slowest-rank
   estimate and its HBM spread (largest - smallest rank). Synthetic tables are dlrm26-like: rows
   10^U(2, 6.5), dim 64 or 128, pooling factor 1 (70%) or 5-40.
2. TorchRec 1.8's planner on the same tables where installed, run in a subprocess capped at 60 s, on the
   sizes it can do (<= 100 tables, <= 64 ranks); its plan is scored by OUR cost model next to ours.
3. Search quality: greedy + local search against an exhaustive branch and bound on random small instances
   (2-6 tables, 2-4 ranks); instances where the exhaustive search exceeds its budget are skipped.
4. The public workloads (dlrm26, small3): ours vs TorchRec's plan, both scored by our cost model.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np

import rectoolkit
from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.serialization import plan_from_json
from rectoolkit.planner import (EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology,
                                WorkloadStats)
from rectoolkit.planner.exhaustive import exhaustive_search

GIB = 1024 ** 3
RESULTS = Path(__file__).resolve().parent / "results" / "planner.md"


def synthetic_tables(n: int, seed: int = 0) -> Tuple[List[EmbeddingBagConfig], Dict[str, float]]:
    if n == 26:
        w = rectoolkit.load_workload("dlrm26")
        return w.tables, w.pooling_factors
    rng = random.Random(seed)
    tables, factors = [], {}
    for i in range(n):
        tables.append(EmbeddingBagConfig(name=f"t{i}", num_embeddings=int(10 ** rng.uniform(2, 6.5)),
                                         embedding_dim=rng.choice([64, 128]), feature_names=[f"f{i}"]))
        factors[f"f{i}"] = 1.0 if rng.random() < 0.7 else float(rng.randint(5, 40))
    return tables, factors


def topology(world_size: int, batch_size: int = 2048) -> Topology:
    return Topology(world_size=world_size, local_world_size=min(8, world_size), compute_device="cuda",
                    hbm_cap=80 * GIB, ddr_cap=1024 * GIB, batch_size=batch_size)


def plan_ours(tables, factors, world_size: int, batch_size: int = 2048):
    planner = EmbeddingShardingPlanner(topology(world_size, batch_size), stats=WorkloadStats(factors, batch_size))
    start = time.perf_counter()
    plan = planner.plan(tables)
    seconds = time.perf_counter() - start
    state = planner.last.state
    return planner, plan, seconds, float(state.time.max()), float(state.hbm.max() - state.hbm.min())


# ---- TorchRec's planner, in a subprocess ----------------------------------------------------------------
_TORCHREC_SCRIPT = r"""
import json, sys, time
import torch, torchrec
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from rectoolkit.plan.torchrec_interop import from_torchrec
from rectoolkit.plan.serialization import plan_to_json
spec = json.loads(sys.stdin.read())
tables = [torchrec.EmbeddingBagConfig(name=t[0], num_embeddings=t[1], embedding_dim=t[2], feature_names=[t[3]])
          for t in spec["tables"]]
constraints = {t[0]: ParameterConstraints(pooling_factors=[t[4]]) for t in spec["tables"]}
topo = Topology(world_size=spec["world_size"], local_world_size=spec["local_world_size"], compute_device="cuda",
                hbm_cap=spec["hbm_cap"], ddr_cap=spec["ddr_cap"])
ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
start = time.perf_counter()
plan = EmbeddingShardingPlanner(topology=topo, batch_size=spec["batch_size"], constraints=constraints,
                                debug=False).plan(ebc, [EmbeddingBagCollectionSharder()])
seconds = time.perf_counter() - start
shapes = {("", t[0]): (t[1], t[2]) for t in spec["tables"]}
ours = from_torchrec(plan, shapes, local_world_size=spec["local_world_size"])
print("RESULT" + json.dumps({"seconds": seconds, "plan": plan_to_json(ours)}))
"""


def plan_torchrec(tables, factors, world_size: int, batch_size: int = 2048, timeout_s: float = 60.0):
    """(seconds, our ShardingPlan of TorchRec's plan) or (None, reason)."""
    topo = topology(world_size, batch_size)
    spec = {"tables": [(t.name, t.num_embeddings, t.embedding_dim, t.feature_names[0], factors[t.feature_names[0]])
                       for t in tables],
            "world_size": world_size, "local_world_size": topo.local_world_size, "hbm_cap": topo.hbm_cap,
            "ddr_cap": topo.ddr_cap, "batch_size": batch_size}
    try:
        done = subprocess.run([sys.executable, "-c", _TORCHREC_SCRIPT], input=json.dumps(spec), capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"> {timeout_s:.0f} s"
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if done.returncode != 0 or not lines:
        return None, "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:80]
    result = json.loads(lines[-1][len("RESULT"):])
    return result["seconds"], plan_from_json(result["plan"])


def torchrec_installed() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("torchrec") is not None
    except Exception:
        return False


# ---- search quality ---------------------------------------------------------------------------------------
def quality_instance(seed: int):
    rng = random.Random(1000 + seed)
    world_size = rng.choice([2, 3, 4])
    local = rng.choice([d for d in range(1, world_size + 1) if world_size % d == 0])
    n = rng.randint(2, 6)
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=int(10 ** rng.uniform(2, 6)),
                                 embedding_dim=rng.choice([16, 32, 64]), feature_names=[f"f{i}"]) for i in range(n)]
    stats = WorkloadStats({f"f{i}": rng.choice([1.0, 2.0, 5.0, 20.0, 50.0]) for i in range(n)},
                          rng.choice([128, 512, 2048]))
    total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
    topo = Topology(world_size=world_size, local_world_size=local, compute_device=rng.choice(["cuda", "cpu"]),
                    hbm_cap=int(total * rng.uniform(0.7, 2.5) / world_size) + 2**23,
                    ddr_cap=int(total * rng.uniform(0.7, 4.0) / world_size) + 2**25,
                    inter_host_bw=rng.choice([12.5, 25.0, 100.0]) * GIB / 1000)
    return topo, tables, stats


def search_quality(instances: int, budget: int) -> Dict[str, object]:
    ratios, skipped, infeasible = [], 0, 0
    for seed in range(instances):
        topo, tables, stats = quality_instance(seed)
        planner = EmbeddingShardingPlanner(topo, stats=stats,
                                           constraints={t.name: ParameterConstraints(min_partition=16) for t in tables})
        try:
            planner.plan(tables)
        except PlannerError:
            infeasible += 1
            continue
        ours = float(planner.last.state.time.max())
        try:
            optimum, _ = exhaustive_search(planner.last.searcher, upper_bound=ours, max_evaluations=budget)
        except RuntimeError:
            skipped += 1
            continue
        ratios.append(ours / optimum if np.isfinite(optimum) else 1.0)  # inf: nothing beats ours
    r = np.array(ratios)
    return dict(instances=instances, compared=len(r), skipped=skipped, infeasible=infeasible,
                within_5=float(np.mean(r <= 1.05)), within_1=float(np.mean(r <= 1.01)),
                optimal=float(np.mean(r <= 1 + 1e-9)), mean=float(r.mean()), worst=float(r.max()))


# ---- main ---------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = [26, 100, 500, 1000] if args.quick else [26, 100, 500, 1000, 5000]
    ranks = [2, 8, 64] if args.quick else [2, 8, 64, 512]
    with_torchrec = torchrec_installed()
    out: List[str] = [f"# Sharding planner ({platform.processor() or platform.machine()}, "
                      f"{'TorchRec installed' if with_torchrec else 'no TorchRec'})", ""]

    out += ["## Planning time", "",
            "| tables | ranks | ours (s) | slowest rank (ms) | HBM spread (GiB) | TorchRec (s) | TorchRec's plan, our model (ms) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    grid = [(n, w) for n in sizes for w in ranks] + ([] if args.quick else [(10000, 512)])
    for n, w in grid:
        tables, factors = synthetic_tables(n)
        try:
            planner, plan, seconds, slowest, spread = plan_ours(tables, factors, w)
            ours = f"{seconds:.3f} | {slowest:.3f} | {spread / GIB:.2f}"
        except PlannerError as error:
            planner, ours = None, f"does not fit ({str(error)[:40]}...) | - | -"
        tr_time, tr_score = "-", "-"
        if with_torchrec and n <= 100 and w <= 64 and planner is not None:
            seconds_tr, tr_plan = plan_torchrec(tables, factors, w)
            if seconds_tr is None:
                tr_time = tr_plan
            else:
                tr_time = f"{seconds_tr:.2f}"
                tr_score = f"{planner.report(tr_plan, tables=tables).summary['max_time_ms']:.3f}"
        elif with_torchrec:
            tr_time = "skipped (capped)"
        out.append(f"| {n} | {w} | {ours} | {tr_time} | {tr_score} |")
        print(out[-1], flush=True)

    budget = 1_000_000
    quality = search_quality(30 if args.quick else 100, budget)
    out += ["", "## Search quality (vs exhaustive branch and bound, 2-6 tables, 2-4 ranks)", "",
            f"- instances: {quality['instances']}, compared: {quality['compared']}, "
            f"skipped (exhaustive over {budget:,} evaluations): {quality['skipped']}, infeasible: {quality['infeasible']}",
            f"- within 5% of the optimum: {quality['within_5']:.1%}; within 1%: {quality['within_1']:.1%}; "
            f"optimal: {quality['optimal']:.1%}",
            f"- mean ratio ours / optimum: {quality['mean']:.4f}; worst: {quality['worst']:.4f}"]
    print("\n".join(out[-4:]), flush=True)

    out += ["", "## Public workloads: slowest rank (ms) by our cost model", "",
            "| workload | ranks | ours | TorchRec's plan | ours / TorchRec |", "| --- | ---: | ---: | ---: | ---: |"]
    for name in ("dlrm26", "small3"):
        w = rectoolkit.load_workload(name)
        for world in (2, 4, 8, 16):
            planner, plan, _, slowest, _ = plan_ours(w.tables, w.pooling_factors, world, w.batch_size_per_rank)
            if with_torchrec:
                seconds_tr, tr_plan = plan_torchrec(w.tables, w.pooling_factors, world, w.batch_size_per_rank)
                theirs = planner.report(tr_plan, tables=w.tables).summary["max_time_ms"] if seconds_tr is not None else None
            else:
                theirs = None
            row = f"| {name} | {world} | {slowest:.4f} | " + (f"{theirs:.4f} | {slowest / theirs:.3f} |" if theirs else "- | - |")
            out.append(row)
            print(row, flush=True)

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(out) + "\n")
    print(f"\nwritten to {RESULTS}")


if __name__ == "__main__":
    main()
