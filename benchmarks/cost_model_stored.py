"""bench_cost_model's analyses of stored runs and its head-to-head variants (`--reestimate`, `--profile`, `--replay`,
`--replicas`): the cost model's estimates recomputed on measurements already taken, saved calibrations compared on
them, stored plans run again head to head, and a plan with more and more of its tables replicated. They use the
benchmark's workloads, plans and measuring; `python benchmarks/bench_cost_model.py --help` runs them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pandas as pd
import torch

import rectoolkit as rtk
from bench_cost_model import (UNWEIGHED, WORKLOADS, WORLD_SIZE, _shard, _sharding, make_topology, measure_workload,
                              per_round, spearman, summarize, torchrec_plan)
from rectoolkit.modules.configs import PoolingType
from rectoolkit.plan.serialization import plan_from_dict, plan_to_dict
from rectoolkit.plan.types import EmbeddingComputeKernel, ShardingPlan
from rectoolkit.planner import Topology
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.load import load_factors
from rectoolkit.planner.measure import estimate_plan
from rectoolkit.planner.profile import CalibrationProfile
from rectoolkit.planner.stats import WorkloadStats
from rectoolkit.planner.step_time import step_at_load
from rectoolkit.planner.tables import collect_tables


def stored_topology(fields: Dict[str, Any]) -> Topology:
    """The Topology a run measured with, from its info["topology"] (plain fields and the profile's dict)."""
    fields = dict(fields)
    profile = fields.pop("profile", None)
    return Topology(profile=CalibrationProfile.from_dict(profile) if profile is not None else None, **fields)


def reestimate(path: Path, recalibrate: bool = False, topology: Optional[Topology] = None) -> List[Dict[str, Any]]:
    """The runs stored in a raw file, with every plan's estimate recomputed by the cost model as it is now: check a
    new model against measurements already taken, without running. Each run is priced with the calibration it ran
    with (its stored profile), so the comparison shows the model's change alone; `recalibrate`: with one fresh
    calibration of this machine instead (make_topology); `topology`: with that one. est_now_ms / est_during_ms are
    the new estimate at the load factors the run probed."""
    runs = json.loads(Path(path).read_text())["runs"]
    fresh = topology if topology is not None else (make_topology(WORLD_SIZE) if recalibrate else None)
    for run_ in runs:
        tables = [rtk.EmbeddingBagConfig(name=t["name"], num_embeddings=t["num_embeddings"],
                                         embedding_dim=t["embedding_dim"], feature_names=t["feature_names"],
                                         pooling=PoolingType(t["pooling"])) for t in run_["tables"]]
        info = run_["measurements"]["info"]
        topology = fresh if fresh is not None else stored_topology(info["topology"])
        planner_tables = collect_tables(tables, info["batch_size"],
                                        stats=WorkloadStats(dict(run_["pooling_factors"]), info["batch_size"]))
        cost_model = CostModel(topology, info["optimizer"], tables=planner_tables)
        for row in run_["measurements"]["plans"]:
            estimate = estimate_plan(cost_model, plan_from_dict(run_["plans"][row["plan"]]), planner_tables)
            # the step estimate where the cost model has one, else the slowest rank's sum
            row["est_step_ms"] = float(np.max(estimate.get("est_step_ms", estimate["est_time_ms"])))
            quiet = float(estimate["est_quiet_ms"][0]) if "est_quiet_ms" in estimate \
                else row["est_step_ms"] / topology.load_factor
            share = float(estimate["est_load_share"][0]) if "est_load_share" in estimate else 1.0
            for when, column in (("before", "est_now_ms"), ("during", "est_during_ms")):
                if f"load_probe_{when}" in info and column in row:
                    row[column] = step_at_load(quiet, share, *load_factors(info[f"load_probe_{when}"]))
        summary = summarize(pd.DataFrame(run_["measurements"]["plans"]))
        run_["summary"] = {**run_["summary"], **summary}
    return runs


def profiles_on_stored_runs(raw_paths: List[Path], profile_paths: List[Path]) -> str:
    """How well each saved profile prices every run stored in `raw_paths`, at each run's probed load (est_now_ms):
    one line per profile over all runs (core Spearman: median, lowest and how many below 0.8; median
    |measured / est_now - 1|: median and largest; the measured time of the core plan the profile prices fastest over
    the measured-fastest plan: median, largest and how many above 1.05x), then each run's core Spearman in order.
    Calibrations of one machine a few minutes apart, compared on the same measurements, show how much the
    calibration moves the estimates (no plan is run)."""
    lines = [f"Saved profiles priced on the {sum(len(json.loads(Path(p).read_text())['runs']) for p in raw_paths)} "
             f"runs stored in {', '.join(Path(p).name for p in raw_paths)} (estimates at each run's probed load):", ""]
    for profile_path in profile_paths:
        topology = Topology.from_profile(profile_path, WORLD_SIZE, compute_device="cpu")
        rows = []
        for raw in raw_paths:
            for run_ in reestimate(raw, topology=topology):
                plans = run_["measurements"]["plans"]
                now = np.array([p["est_now_ms"] for p in plans])
                measured = np.array([p["step_ms"] for p in plans])
                core = np.array([p["plan"] not in UNWEIGHED for p in plans])
                pick = measured[core][np.argmin(now[core])] / measured.min()
                rows.append((spearman(now[core], measured[core]), float(np.median(np.abs(measured / now - 1))), pick))
        core_rho, error, pick = (np.array(column) for column in zip(*rows))
        lines += [f"- {Path(profile_path).name}: core Spearman median {np.median(core_rho):.2f}, lowest "
                  f"{core_rho.min():.2f}, below 0.8 in {int((core_rho < 0.8).sum())}/{len(rows)}; median |meas/now - 1| "
                  f"median {np.median(error):.0%}, largest {error.max():.0%}; the core plan it prices fastest measured "
                  f"{np.median(pick):.3f}x the fastest (median), {pick.max():.3f}x at most, above 1.05x in "
                  f"{int((pick > 1.05).sum())}/{len(rows)}",
                  "  per run, core Spearman: " + " ".join(f"{x:.2f}" for x in core_rho)]
    return "\n".join(lines)


def replay(raw_paths: List[Path], workload_name: str, rounds: int, steps: int) -> str:
    """The planner's and TorchRec's plans stored in `raw_paths` for one workload, each distinct plan once, run again
    head to head (measure_plans: `rounds` alternating rounds of `steps` steps, no phase timing): does a plan that
    measured a few percent slower than another in a repeat stay slower with many more rounds? Per plan: the
    median step (slowest rank) and the range over rounds, and the ratio to TorchRec's plan round by round (median
    and range of the paired ratios, where a burst of load slows both alike)."""
    workload = WORKLOADS[workload_name]()
    plans, origin = {}, {}
    for raw in raw_paths:
        for run_ in json.loads(Path(raw).read_text())["runs"]:
            if run_["workload"] != workload_name:
                continue
            for kind in ("torchrec", "planner"):
                stored = run_["plans"].get(kind)
                if stored is None or any(stored["plan"] == plan_to_dict(p)["plan"] for p in plans.values()):
                    continue
                name = "torchrec" if kind == "torchrec" and "torchrec" not in plans else f"{kind}_{len(plans)}"
                plans[name] = plan_from_dict(stored)
                origin[name] = f"{Path(raw).name} repeat {run_['repeat']}"
    if "torchrec" not in plans or len(plans) < 2:
        raise SystemExit(f"--replay: the raw files hold no TorchRec plan and another for {workload_name}")
    load_before = os.getloadavg()
    result = measure_workload(plans, workload, steps=steps, rounds=rounds, phase_steps=0)
    rounds_ms = per_round(result)
    ratio = rounds_ms.div(rounds_ms["torchrec"], axis=0)
    lines = [f"Head to head, {workload_name}: the distinct planner and TorchRec plans of "
             f"{', '.join(Path(p).name for p in raw_paths)}, {rounds} alternating rounds of {steps} steps "
             f"(measure_plans; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
             f"{torch.get_num_threads()} torch thread(s) here, 1 per rank).", "",
             "| plan | from | step ms: median of rounds [min, max] | / TorchRec's, per round: median [min, max] | "
             "rounds slower than TorchRec's |", "| --- | --- | ---: | ---: | ---: |"]
    for name in sorted(plans, key=lambda n: float(rounds_ms[n].median())):
        ms, r = rounds_ms[name], ratio[name]
        lines.append(f"| {name} | {origin[name]} | {ms.median():.1f} [{ms.min():.1f}, {ms.max():.1f}] | "
                     f"{r.median():.3f} [{r.min():.3f}, {r.max():.3f}] | "
                     f"{int((r > 1).sum()) if name != 'torchrec' else '-'}/{rounds} |")
    return "\n".join(lines)


REPLICA_CANDIDATES = ["t_cat_8", "t_cat_19", "t_cat_16", "t_cat_22", "t_cat_21", "t_cat_5", "t_cat_13", "t_cat_24",
                      "t_cat_4"]  # dlrm26's nine smallest tables (3 to 305 rows), the ones the planner replicates


def replicas(rounds: int, steps: int, counts=(0, 1, 3, 6, 9)) -> str:
    """TorchRec's plan of dlrm26_100k with its k smallest tables replicated (data-parallel) instead, k in `counts`,
    run head to head (`rounds` alternating rounds of `steps` steps, phase timing on): what a data-parallel group
    and each replica cost beside table-wise tables, measured and priced."""
    workload = WORKLOADS["dlrm26_100k"]()
    topology = make_topology(WORLD_SIZE)
    base = torchrec_plan(workload, WORLD_SIZE)
    config = {t.name: t for t in workload.tables}
    plans = {}
    for k in counts:
        module_plan = dict(base.plan[""])
        for name in REPLICA_CANDIDATES[:k]:
            rows, dim = config[name].num_embeddings, config[name].embedding_dim
            module_plan[name] = _sharding("data_parallel", [_shard(r, 0, 0, rows, dim) for r in range(WORLD_SIZE)],
                                          EmbeddingComputeKernel.DENSE.value)
        plans[f"replicas_{k}"] = ShardingPlan({"": module_plan})
    load_before = os.getloadavg()
    result = measure_workload(plans, workload, steps=steps, rounds=rounds, phase_steps=1, topology=topology)
    frame = result.plans.set_index("plan")
    rounds_ms = per_round(result)
    lines = [f"dlrm26_100k, TorchRec's plan with its k smallest tables replicated, {rounds} alternating rounds of "
             f"{steps} steps (load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; profile: "
             f"replica {topology.profile.replica_ms} ms, data-parallel group "
             f"{topology.profile.group_ms.get('data_parallel')} ms).", "",
             "| replicated | estimated ms | measured ms | CPU ms (busiest rank) | / none, per round: median [min, max] | "
             "rounds slower |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for k in counts:
        name, ratio = f"replicas_{k}", rounds_ms[f"replicas_{k}"] / rounds_ms[f"replicas_{counts[0]}"]
        lines.append(f"| {k} | {frame.loc[name, 'est_step_ms']:.2f} | {frame.loc[name, 'step_ms']:.2f} | "
                     f"{frame.loc[name, 'cpu_ms']:.2f} | {ratio.median():.3f} [{ratio.min():.3f}, {ratio.max():.3f}] | "
                     f"{int((ratio > 1).sum()) if k != counts[0] else '-'}/{rounds} |")
    return "\n".join(lines)
