"""Measure candidate plans for real, beside the planner's estimates: step time, its parts, bytes and memory.

    >>> import rectoolkit as rtk
    >>> from rectoolkit.planner import measure_plans
    >>> tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16,
    ...                                  feature_names=[f"f{i}"]) for i in range(2)]
    >>> plans = {"planner": rtk.EmbeddingShardingPlanner(rtk.Topology(2, "cpu")).plan(tables)}
    >>> result = measure_plans(plans, tables, 2, steps=5, batch_size=64)      # doctest: +SKIP
    >>> result.plans[["plan", "est_step_ms", "step_ms", "bytes_exact", "memory_exact"]]   # doctest: +SKIP

How it runs (the workers' side: rectoolkit.planner.measure_worker): ONE `rtk.launch` of `world_size` local workers (gloo on CPU, `num_threads` torch threads per
rank) builds every plan's DistributedModelParallel over an EmbeddingBagCollection with its fused optimizer,
so start-up is paid once. Per plan: one step whose bytes the instrumented collectives count (compared with
the cost model's bytes for that very batch: they must be equal), `warmup` steps, then `rounds` rounds in
which the plans take turns (A, B, C, then C, B, A, ...), each running one untimed step (to warm the caches
the other plans used), a block of `steps` timed steps and `phase_steps` steps timed phase by phase, so that
machine load hits every plan alike.

- A timed step starts on a barrier (not timed); each rank then times forward + backward (the fused update
  happens in backward) + the step of a plain SGD (lr `lr`) over the weights without a fused optimizer: the
  DATA_PARALLEL replicas (TorchRec's dense kernel: their averaged gradient waits in .grad) and the shards
  planned compute_kernel "dense", in wall-clock and process CPU time. A rank's wall time includes waiting for its peers
  inside the collectives, its CPU time does not (gloo blocks): wall says what the step costs, CPU whose
  work it is.
- A phase step puts a barrier before every input_dist, lookup and output_dist of every sharding-type group
  and before backward, and times each on its own (the `phases` frame per group; the `ranks` frame sums the
  groups): `input_dist_ms`, `lookup_ms` (forward kernel), `output_dist_ms`, `forward_other_ms` (splitting
  the batch and placing the outputs) and `backward_ms` (the output collectives' backward, the kernel's
  backward with its fused update, the data-parallel all-reduce and the replicas' SGD step). Barriers make the phases honest per
  rank and the step slower; that is why phase steps are apart from the timed steps.
- Load: before the first timed step and after the last, the ranks run rectoolkit.planner.load's synthetic step
  (`measure_load`, about a second): how much slower than quiet the machine runs steps right now. The estimate
  times that factor is `est_now_ms`, a prediction made before any plan was timed. A few more synthetic steps
  after every plan's block give the load while the plans ran (`est_during_ms`: what the estimate would have
  been had that load been known; it tells a wrong model from a machine whose load moved).
- Estimates come from `estimate_plan` (one function: the cost model's per-rank terms), bytes from the cost
  model's traffic on the measured batch, memory from DistributedModelParallel.memory_usage().

Data: SyntheticData (rectoolkit.train.data) with the tables' pooling factors, Zipf ids (`zipf_alpha`, 0 for
uniform) and a fixed `seed`; `num_batches` batches per rank are made before timing and used in turn.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.launch.affinity import CpuBinding, all_rank_cpus
from rectoolkit.modules.configs import EmbeddingBagConfig, PoolingType
from rectoolkit.plan.traffic import COLLECTIVES, batch_id_counter
from rectoolkit.plan.types import ParameterSharding, ShardingPlan
from rectoolkit.plan.validation import validate_plan
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.load import PROBE_SECONDS, PROBE_STEPS, LoadProbe, load_factors, measure_load
from rectoolkit.planner.measure_worker import GROUP_PHASES, RunSpec, make_batches, measure_worker
from rectoolkit.planner.stats import WorkloadStats
from rectoolkit.planner.step_time import step_at_load
from rectoolkit.planner.tables import PlannerTable, collect_tables
from rectoolkit.planner.topology import Topology

if TYPE_CHECKING:  # pandas loads when frames are built: `import rectoolkit` stays without it (0.4 s a process)
    import pandas as pd

PHASES = GROUP_PHASES + ("forward_other", "backward")  # the last two for the whole collection
MEASURED_STEP_COLUMNS = ("step_ms", "step_ms_min", "cpu_ms")  # what pick_measured_fastest can compare
PlanInput = Union[ShardingPlan, Mapping[str, Any]]


# ------------------------------------------------------------------------------------------ the estimate
def estimate_plan(cost_model: CostModel, plan: ShardingPlan, tables: Sequence[PlannerTable]) -> Dict[str, np.ndarray]:
    """The planner's estimate of one plan, per rank: column name -> [world_size] values.

    `est_step_ms` is what the planner minimizes (the step estimate, the same on every rank), `est_time_ms` each
    rank's own sums (what the search balances); the other `est_*_ms` columns are
    its parts, `est_memory_*_bytes` the memory parts that DistributedModelParallel.memory_usage() measures.
    This is the one place that reads the cost model, so a new cost model changes only this function.
    """
    cost = cost_model.evaluate(plan, tables)
    W = len(cost.time_ms)
    out = {"est_step_ms": np.full(W, cost.step_time_ms),
           "est_time_ms": cost.time_ms, "est_lookup_fwd_ms": cost.lookup_fwd_ms,
           "est_lookup_bwd_ms": cost.lookup_bwd_ms, "est_comm_ms": sum(cost.comm_ms.values())}
    for name, ms in cost.comm_ms.items():
        if np.any(ms):
            out[f"est_{name}_ms"] = ms
    out["est_memory_weights_bytes"] = cost.memory["weights"]
    out["est_memory_optimizer_bytes"] = cost.memory["optimizer"]
    out["est_bytes_sent"] = _off_diagonal_row_sums(cost.traffic)
    if cost.step is not None:  # the quiet step and the share of a machine load it gets (step_time.step_at_load)
        out["est_quiet_ms"] = np.full(W, cost.step.quiet_ms)
        out["est_load_share"] = np.full(W, cost.step.load_share)
    return out


def _off_diagonal_row_sums(traffic: Mapping[str, np.ndarray]) -> np.ndarray:
    """Bytes each rank sends to the other ranks, over the priced collectives."""
    total = sum(np.asarray(m, dtype=float) for name, m in traffic.items() if name in COLLECTIVES)
    total = np.array(total, dtype=float)
    np.fill_diagonal(total, 0.0)
    return total.sum(axis=1)


# ------------------------------------------------------------------------------------------ the result
@dataclass
class PlanMeasurements:
    """What `measure_plans` measured, as DataFrames.

    plans: one row per plan: est_step_ms (the cost model's step estimate, CostModel.evaluate().step_time_ms, at the
        topology's load_factor), est_load_share (the share of a machine load the plan gets: step_time.step_at_load),
        est_now_ms (the quiet estimate at the load factor the run probed before its first timed step:
        rectoolkit.planner.load, info["load_probe_before"]), est_during_ms (the same with the
        load probed between the plans' blocks, info["load_probe_during"]), step_ms (median over timed steps of
        the slowest rank's wall time), step_ms_min, cpu_ms (median over steps of the busiest rank's CPU time),
        measured_over_estimated, measured_over_now, measured_over_during, bytes_exact and memory_exact (measured == estimated, every
        rank).
    ranks: one row per plan and rank: measured step (median / min, wall / CPU), phase medians (`<phase>_ms`,
        wall; `<phase>_cpu_ms`), the plan's shape (shards on the rank, sharding types with a shard here and in
        the plan), collective calls per step, bytes sent, memory, and the `est_*` columns.
    steps: every timed step (plan, round, step, rank, wall_ms, cpu_ms); phases: every phase of every phase
        step (plan, round, step, rank, group, phase, wall_ms, cpu_ms), input_dist / lookup / output_dist per
        sharding-type group (the sharded collection's group name, e.g. "row_wise"), forward_other and
        backward for the whole collection (group ""); bytes: measured / exact / expected bytes per plan,
        collective, source and destination rank.
    info: the run's settings, the machine's load average before and after, and the load probes
        (rectoolkit.planner.load.LoadProbe as dicts) taken before the first timed step and between the blocks.
    """

    plans: pd.DataFrame
    ranks: pd.DataFrame
    steps: pd.DataFrame
    phases: pd.DataFrame
    bytes: pd.DataFrame
    info: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """Plain lists and numbers (JSON-ready): info and every frame as a list of records."""
        frames = {name: json.loads(getattr(self, name).to_json(orient="records"))
                  for name in ("plans", "ranks", "steps", "phases", "bytes")}
        return {"info": self.info, **frames}

    def __repr__(self) -> str:
        load = self.info.get("load_average_before"), self.info.get("load_average_after")
        columns = [c for c in ("plan", "est_step_ms", "est_now_ms", "step_ms", "cpu_ms", "measured_over_now",
                               "bytes_exact", "memory_exact") if c in self.plans]
        return (f"PlanMeasurements({len(self.plans)} plans, world_size={self.info.get('world_size')}, "
                f"batch_size={self.info.get('batch_size')}, load average {load[0]} -> {load[1]})\n"
                + self.plans[columns].to_string(index=False))


# ------------------------------------------------------------------------------------------ the caller side
def measure_plans(plans: Union[Mapping[str, PlanInput], Sequence[PlanInput]], tables: Sequence[EmbeddingBagConfig],
                  world_size: int, steps: int = 10, *, warmup: int = 3, rounds: int = 3, phase_steps: int = 2,
                  batch_size: int = 512, pooling_factors: Optional[Mapping[str, float]] = None,
                  zipf_alpha: float = 0.0, seed: int = 0, num_batches: int = 4, topology: Optional[Topology] = None,
                  optimizer: str = "sgd", lr: float = 0.01, num_threads: int = 1,
                  timeout_s: Optional[float] = 1800.0, cpu_binding: CpuBinding = "none") -> PlanMeasurements:
    """Run every plan for a few steps on `world_size` local workers and return measured vs estimated.

    Args:
        plans: name -> ShardingPlan (or a list, named "plan0", "plan1", ...). A plan holds one module's tables
            (any module path; a bare {table: ParameterSharding} dict is the module "").
        tables: the EmbeddingBagConfigs every plan shards (SUM or MEAN pooling).
        world_size: ranks (local processes, gloo on CPU).
        steps: timed steps per plan per round; warmup: untimed steps per plan first (the first one also
            counts bytes); rounds: alternating rounds; phase_steps: steps timed phase by phase per plan per
            round (0: none).
        batch_size: samples per rank; pooling_factors: feature -> mean ids per sample (default 1.0);
            zipf_alpha: id skew (0: uniform); seed: the data's seed; num_batches: batches per rank, in turn.
        topology: the Topology the estimates use (default: Topology(world_size, "cpu")); its world_size must
            be `world_size`, its local_world_size decides the ranks per host the plans run with.
        optimizer, lr: the fused embedding optimizer (and a plain SGD for the DATA_PARALLEL replicas and the
            shards planned kernel "dense", which have no fused optimizer, as in TorchRec).
        num_threads: torch threads per rank; timeout_s: the whole launch's limit (None: none).
        cpu_binding: the cores of each rank, as in `rectoolkit.launch.start` (default "none": where the scheduler
            puts them; "auto": each rank its own share); `info["cpus"]` records them.

    Returns a PlanMeasurements (DataFrames: plans, ranks, steps, phases, bytes; info).
    """
    named = _named_plans(plans)
    tables = _check_tables(tables)
    factors = _check_pooling_factors(pooling_factors, tables)
    _check_ints(world_size=world_size, steps=steps, warmup=warmup, rounds=rounds, batch_size=batch_size,
                num_batches=num_batches, num_threads=num_threads)
    _check_ints(minimum=0, phase_steps=phase_steps, seed=seed)
    if not zipf_alpha >= 0:
        raise ValueError(f"measure_plans: zipf_alpha must be >= 0 (0 = uniform ids), got {zipf_alpha!r}")
    if not lr > 0:
        raise ValueError(f"measure_plans: lr must be positive, got {lr!r}")
    EmbOptimType.parse(optimizer)
    if topology is None:
        topology = Topology(world_size=world_size, compute_device="cpu")
    if topology.world_size != world_size:
        raise ValueError(f"measure_plans: topology has world_size {topology.world_size} but world_size={world_size}; "
                         "pass a Topology of the same world size")
    if topology.compute_device != "cpu":
        raise ValueError(f"measure_plans: topology.compute_device is {topology.compute_device!r} but the workers run on "
                         "CPU (gloo); pass Topology(..., compute_device='cpu')")
    planner_tables = collect_tables(tables, batch_size, stats=WorkloadStats(pooling_factors=factors))
    cost_model = CostModel(topology, optimizer, tables=planner_tables)
    estimates = {}
    for name, plan in named.items():
        _check_plan(name, plan, tables, world_size)
        try:
            estimates[name] = estimate_plan(cost_model, plan, planner_tables)
        except ValueError as error:
            raise ValueError(f"measure_plans: plan {name!r}: {error}") from error
    spec = RunSpec(named, list(tables), factors, batch_size, num_batches, float(zipf_alpha), seed, str(optimizer),
                    float(lr), topology.local_world_size, steps, warmup, rounds, phase_steps)
    from rectoolkit.launch import launch

    load_before = os.getloadavg()
    started = time.perf_counter()
    per_rank = launch(measure_worker, world_size, spec, num_threads=num_threads, backend="gloo", timeout_s=timeout_s,
                      echo_output=False, cpu_binding=cpu_binding)
    info = {"world_size": world_size, "local_world_size": topology.local_world_size, "batch_size": batch_size,
            "steps": steps, "warmup": warmup, "rounds": rounds, "phase_steps": phase_steps,
            "num_threads": num_threads, "zipf_alpha": float(zipf_alpha), "seed": seed, "num_batches": num_batches,
            "optimizer": str(optimizer), "lr": lr, "plans": list(named),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "launch_s": round(time.perf_counter() - started, 2), "cpu_count": os.cpu_count(),
            "cpus": all_rank_cpus(cpu_binding, world_size),
            "torch": torch.__version__, "machine": platform.machine(), "topology": _topology_fields(topology),
            "load_probe_before": per_rank[0]["load"]["before"], "load_probe_during": per_rank[0]["load"]["during"]}
    exact = {name: _exact_traffic(cost_model, plan, planner_tables, spec, world_size) for name, plan in named.items()}
    expected = {name: cost_model.traffic(plan, planner_tables) for name, plan in named.items()}
    return _frames(named, [result["plans"] for result in per_rank], estimates, exact, expected, info)


def _probe_worker(ctx: Any, steps: int, min_seconds: float) -> Dict[str, Any]:
    return measure_load(steps, min_seconds=min_seconds).to_dict()


def probe_load(world_size: int = 2, steps: int = PROBE_STEPS, min_seconds: float = PROBE_SECONDS,
               num_threads: int = 1, timeout_s: Optional[float] = 120.0,
               cpu_binding: CpuBinding = "none") -> LoadProbe:
    """Measure the load factor on `world_size` local worker processes (gloo on CPU; about 5 s with start-up). From
    a script, call it under `if __name__ == "__main__":` (the workers are spawned processes). `cpu_binding`: the
    ranks' cores, as in `rectoolkit.launch.start` (default "none", as measure_plans runs them by default).

        probe = probe_load(2)                 # doctest: +SKIP
        topology = topology.at_load(probe)    # doctest: +SKIP
    """
    from rectoolkit.launch import launch

    if not isinstance(world_size, int) or world_size <= 0:
        raise ValueError(f"probe_load: world_size must be a positive int, got {world_size!r}")
    results = launch(_probe_worker, world_size, steps, float(min_seconds), num_threads=num_threads, backend="gloo",
                     timeout_s=timeout_s, echo_output=False, cpu_binding=cpu_binding)
    fields = results[0]
    fields["load_average"] = tuple(fields["load_average"])
    return LoadProbe(**fields)


def pick_measured_fastest(candidate_plans: Union[Mapping[str, PlanInput], Sequence[PlanInput]],
                          tables: Sequence[EmbeddingBagConfig], world_size: int, by: str = "step_ms",
                          **measure_args: Any) -> Tuple[ShardingPlan, PlanMeasurements]:
    """Measure-in-the-loop: run the candidates (`measure_plans`, same arguments) and return the one whose
    measured step time is lowest, as given, with the evidence (its name in `evidence.info["picked"]`).

    `by`: the `plans` column compared: "step_ms" (the slowest rank's median wall time, default),
    "step_ms_min" (its minimum: what the plan costs when the machine lets it run, steadier under load) or
    "cpu_ms" (the busiest rank's CPU time).

        plan, evidence = pick_measured_fastest({"a": plan_a, "b": plan_b}, tables, 2, steps=5)   # doctest: +SKIP
        evidence.plans.sort_values("step_ms")                                                     # doctest: +SKIP
    """
    if by not in MEASURED_STEP_COLUMNS:
        raise ValueError(f"pick_measured_fastest: by={by!r} is not a measured step column; use one of "
                         f"{list(MEASURED_STEP_COLUMNS)}")
    result = measure_plans(candidate_plans, tables, world_size, **measure_args)
    fastest = str(result.plans.loc[result.plans[by].idxmin(), "plan"])
    result.info["picked"] = fastest
    given = dict(candidate_plans) if isinstance(candidate_plans, Mapping) else {
        f"plan{i}": plan for i, plan in enumerate(candidate_plans)}
    plan = given[fastest]
    return (plan if isinstance(plan, ShardingPlan) else ShardingPlan({"": dict(plan)})), result


def _exact_traffic(cost_model: CostModel, plan: ShardingPlan, tables: Sequence[PlannerTable], spec: RunSpec,
                   world_size: int) -> Dict[str, np.ndarray]:
    """The cost model's bytes for the batch the counting step ran (every rank's batch 0)."""
    first = [make_batches(dataclasses.replace(spec, num_batches=1), rank, world_size)[0]
             for rank in range(world_size)]
    return cost_model.traffic(plan, tables, [spec.batch_size] * world_size, batch_id_counter(first))


def _frames(named: Mapping[str, ShardingPlan], per_rank: Sequence[Dict[str, Any]], estimates, exact, expected,
            info: Dict[str, Any]) -> PlanMeasurements:
    import pandas as pd

    step_rows, phase_rows, byte_rows, rank_rows, plan_rows = [], [], [], [], []
    for name in named:
        for rank, result in enumerate(per_rank):
            step_rows += [dict(plan=name, round=r, step=s, rank=rank, wall_ms=w, cpu_ms=c)
                          for r, s, w, c in result[name]["steps"]]
            phase_rows += [dict(plan=name, round=r, step=s, rank=rank, group=g, phase=p, wall_ms=w, cpu_ms=c)
                           for r, s, g, p, w, c in result[name]["phases"]]
        measured = {k: np.asarray(v) for k, v in per_rank[0][name]["bytes"].items()}
        for collective in sorted(set(measured) | {c for c in COLLECTIVES if np.any(exact[name][c])}):
            got = measured.get(collective)
            for src in range(info["world_size"]):
                for dst in range(info["world_size"]):
                    byte_rows.append(dict(
                        plan=name, collective=collective, src=src, dst=dst,
                        measured=int(got[src, dst]) if got is not None else 0,
                        exact=float(exact[name][collective][src, dst]) if collective in exact[name] else None,
                        expected=float(expected[name][collective][src, dst]) if collective in expected[name] else None))
    steps = pd.DataFrame(step_rows, columns=["plan", "round", "step", "rank", "wall_ms", "cpu_ms"])
    phases = pd.DataFrame(phase_rows, columns=["plan", "round", "step", "rank", "group", "phase", "wall_ms", "cpu_ms"])
    bytes_frame = pd.DataFrame(byte_rows, columns=["plan", "collective", "src", "dst", "measured", "exact", "expected"])
    priced = bytes_frame[bytes_frame.collective.isin(COLLECTIVES)]
    for name in named:
        est = estimates[name]
        mine = priced[priced.plan == name]
        bytes_exact = bool((mine.measured == mine.exact).all())
        memory_exact = True
        for rank, result in enumerate(per_rank):
            row: Dict[str, Any] = {"plan": name, "rank": rank}
            s = steps[(steps.plan == name) & (steps["rank"] == rank)]
            row.update(step_ms=s.wall_ms.median(), step_ms_min=s.wall_ms.min(), cpu_ms=s.cpu_ms.median(),
                       cpu_ms_min=s.cpu_ms.min())
            p = phases[(phases.plan == name) & (phases["rank"] == rank)]
            for phase in PHASES:  # summed over the groups within a step, then the median over steps
                q = p[p.phase == phase].groupby("step")[["wall_ms", "cpu_ms"]].sum()
                row[f"{phase}_ms"] = q.wall_ms.median() if len(q) else np.nan
                row[f"{phase}_cpu_ms"] = q.cpu_ms.median() if len(q) else np.nan
            held = [ps.sharding_type for _, _, ps in named[name].items() for shard in ps.shards if shard.rank == rank]
            row.update(shards=len(held), local_sharding_types=len(set(held)),
                       sharding_types=len({ps.sharding_type for _, _, ps in named[name].items()}))
            calls = result[name]["calls"]
            row["collective_calls"] = int(sum(calls.values()))
            row["calls_by_collective"] = json.dumps(dict(sorted(calls.items())))
            sent = mine[(mine.src == rank) & (mine.dst != rank)]
            row["bytes_sent"] = int(sent.measured.sum())
            memory = result[name]["memory"]
            row["memory_weights_bytes"] = int(memory["embedding_weights"])
            row["memory_optimizer_bytes"] = int(memory["embedding_optimizer"])
            for key, values in est.items():
                row[key] = float(values[rank])
            memory_exact &= (row["memory_weights_bytes"] == row["est_memory_weights_bytes"]
                             and row["memory_optimizer_bytes"] == row["est_memory_optimizer_bytes"])
            rank_rows.append(row)
        slowest = steps[steps.plan == name].groupby("step")[["wall_ms", "cpu_ms"]].max()
        est_step = float(est["est_step_ms"][0])
        quiet = float(est["est_quiet_ms"][0]) if "est_quiet_ms" in est else est_step / info["topology"]["load_factor"]
        share = float(est["est_load_share"][0]) if "est_load_share" in est else 1.0
        est_now, est_during = (step_at_load(quiet, share, *load_factors(info[f"load_probe_{when}"]))
                               for when in ("before", "during"))
        step_ms = float(slowest.wall_ms.median())
        plan_rows.append(dict(plan=name, est_step_ms=est_step, est_load_share=share, est_now_ms=est_now,
                              est_during_ms=est_during,
                              step_ms=step_ms, step_ms_min=float(slowest.wall_ms.min()),
                              cpu_ms=float(slowest.cpu_ms.median()),
                              measured_over_estimated=step_ms / est_step if est_step > 0 else np.nan,
                              measured_over_now=step_ms / est_now if est_now > 0 else np.nan,
                              measured_over_during=step_ms / est_during if est_during > 0 else np.nan,
                              bytes_exact=bytes_exact, memory_exact=bool(memory_exact)))
    return PlanMeasurements(pd.DataFrame(plan_rows), pd.DataFrame(rank_rows), steps, phases, bytes_frame, info)


# ------------------------------------------------------------------------------------------ input checks
def _named_plans(plans: Any) -> Dict[str, ShardingPlan]:
    one_module_plan = isinstance(plans, Mapping) and plans and all(isinstance(v, ParameterSharding)
                                                                   for v in plans.values())
    if isinstance(plans, ShardingPlan) or one_module_plan:
        raise TypeError("measure_plans: pass several plans as {name: plan} (or a list of plans), not one plan; "
                        "e.g. measure_plans({'mine': plan}, tables, world_size)")
    if isinstance(plans, Mapping):
        items = list(plans.items())
    elif isinstance(plans, Sequence) and not isinstance(plans, str):
        items = [(f"plan{i}", plan) for i, plan in enumerate(plans)]
    else:
        raise TypeError(f"measure_plans: plans must be {{name: ShardingPlan}} or a list of ShardingPlans, "
                        f"got {type(plans).__name__}")
    if not items:
        raise ValueError("measure_plans: no plans given; pass at least one {name: ShardingPlan}")
    named: Dict[str, ShardingPlan] = {}
    for name, plan in items:
        if not isinstance(name, str) or not name:
            raise TypeError(f"measure_plans: plan names must be non-empty strings, got {name!r}")
        if isinstance(plan, Mapping):
            plan = ShardingPlan({"": dict(plan)})
        if not isinstance(plan, ShardingPlan):
            raise TypeError(f"measure_plans: plan {name!r} is a {type(plan).__name__}, not a ShardingPlan")
        if len(plan.plan) != 1:
            raise ValueError(f"measure_plans: plan {name!r} has modules {sorted(plan.plan)}; measure one "
                             "collection's plan at a time (pass ShardingPlan({path: plan.plan[path]}))")
        named[name] = ShardingPlan({"": dict(next(iter(plan.plan.values())))})  # the collection is the model
    return named


def _check_tables(tables: Any) -> List[EmbeddingBagConfig]:
    tables = list(tables) if not isinstance(tables, (str, bytes)) else None
    if not tables:
        raise ValueError("measure_plans: tables must be a non-empty list of EmbeddingBagConfig")
    names = set()
    for table in tables:
        if not isinstance(table, EmbeddingBagConfig):
            raise TypeError(f"measure_plans: tables must be EmbeddingBagConfigs (pooled lookups); got a "
                            f"{type(table).__name__} ({getattr(table, 'name', table)!r})")
        if table.pooling == PoolingType.NONE:
            raise ValueError(f"measure_plans: table {table.name!r} has pooling NONE; use SUM or MEAN")
        if table.name in names:
            raise ValueError(f"measure_plans: table {table.name!r} appears twice; give every table its own name")
        names.add(table.name)
    return tables


def _check_pooling_factors(pooling_factors: Optional[Mapping[str, float]], tables: Sequence[EmbeddingBagConfig]
                           ) -> Dict[str, float]:
    features = [f for t in tables for f in t.feature_names]
    factors = dict(pooling_factors or {})
    unknown = sorted(set(factors) - set(features))
    if unknown:
        raise ValueError(f"measure_plans: pooling_factors name features {unknown} that no table has "
                         f"(features: {features})")
    for feature, value in factors.items():
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"measure_plans: pooling factor of {feature!r} must be a positive number, got {value!r}")
    return {f: float(factors.get(f, 1.0)) for f in features}


def _check_ints(minimum: int = 1, **values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"measure_plans: {name} must be an int >= {minimum}, got {value!r}")


def _check_plan(name: str, plan: ShardingPlan, tables: Sequence[EmbeddingBagConfig], world_size: int) -> None:
    """Shards tile every table, ranks exist, exactly the given tables (rectoolkit.plan.validation)."""
    validate_plan(plan, tables, world_size, source=f"measure_plans: plan {name!r}")


def _topology_fields(topology: Topology) -> Dict[str, Any]:
    fields = {k: v for k, v in topology.__dict__.items() if isinstance(v, (int, float, str, type(None)))}
    fields["profile"] = topology.profile.to_dict() if topology.profile is not None else None
    return fields
