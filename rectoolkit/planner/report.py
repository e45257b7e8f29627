"""PlanReport: a plan as pandas DataFrames (placement, memory, time, bytes per collective, per-table choice).

Columns (stable; widgets and figures read them):

* ``placement``: module, table, shard, sharding_type, compute_kernel, rank, host, row_offset, rows,
  col_offset, columns, weight_bytes, optimizer_bytes, hbm_bytes, ddr_bytes - one row per shard.
* ``memory``: rank, host, weights, optimizer, gradients, input_buffer, output_buffer, dense (bytes by part),
  hbm_bytes, hbm_cap_bytes, hbm_free_bytes, ddr_bytes, ddr_cap_bytes, ddr_free_bytes, fits - one row per rank.
* ``time``: rank, host, lookup_fwd_ms, lookup_bwd_ms, one ``<collective>_ms`` per collective of
  rectoolkit.plan.traffic.COLLECTIVES, comm_ms, total_ms - one row per rank.
* ``traffic``: collective -> DataFrame [W x W] of bytes (index: source rank "src", columns: destination "dst").
* ``tables``: module, table, rows, dim, size_bytes, sharding_type, compute_kernel, ranks, slowest_ms,
  runner_up, runner_up_ms, reason - one row per table (runner-up columns are None for plans made elsewhere).
* ``step``: the step estimate by group: module, sharding_type, fixed_ms, latency_ms, lookup_fwd_ms, comm_fwd_ms,
  lookup_bwd_ms, comm_bwd_ms, total_ms - one row per sharding-type group, a first row "per step" for the fixed
  cost of a step, when a host has more ranks than cores a row "ranks beyond the cores (xO)" for what sharing them
  adds (StepTime.shared_cores_ms), and, when Topology.load_factor or load_factor_alone is not 1, a last row "machine load (xF, xA
  alone)" for what other work on the machine adds (rectoolkit.planner.step_time.StepTime; the sum of total_ms is summary["step_time_ms"]).
* ``candidates``: label, estimated_step_ms, measured_step_ms, chosen - the whole plans the planner priced (and
  ran, with measure_top_k); empty unless it compared candidates.
* ``summary``: dict with step_time_ms, max_time_ms (the slowest rank's own sums), slowest_rank, total_bytes,
  max_hbm_bytes, min_hbm_bytes, memory_spread_bytes, fits, objective, profile (where the time terms came from).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

import numpy as np

from rectoolkit.plan.traffic import COLLECTIVES, batch_id_counter, batch_sizes_of
from rectoolkit.plan.types import ShardingPlan, ShardingType
from rectoolkit.planner.cost import MEMORY_PARTS, CostModel
from rectoolkit.planner.step_time import step_at_load
from rectoolkit.planner.enumerate import ShardingOption
from rectoolkit.planner.load import load_factors
from rectoolkit.planner.planner import PlanningResult, format_bytes
from rectoolkit.planner.tables import PlannerTable

if TYPE_CHECKING:  # pandas loads when a report is built: `import rectoolkit` stays without it (0.4 s a process)
    import pandas as pd


def _empty_frame() -> "pd.DataFrame":
    import pandas as pd

    return pd.DataFrame()


@dataclass
class PlanReport:
    """DataFrames describing one plan; see the module docstring for the columns."""

    placement: pd.DataFrame
    memory: pd.DataFrame
    time: pd.DataFrame
    traffic: Dict[str, pd.DataFrame]
    tables: pd.DataFrame
    summary: Dict[str, Any] = field(default_factory=dict)
    step: pd.DataFrame = field(default_factory=_empty_frame)
    candidates: pd.DataFrame = field(default_factory=_empty_frame)

    def total_traffic(self) -> pd.DataFrame:
        """Bytes per step summed over every collective, [W x W]."""
        return sum(self.traffic.values())

    def _repr_text(self) -> str:
        s = self.summary
        return (f"PlanReport: step {s['step_time_ms']:.3f} ms estimated, slowest rank {s['slowest_rank']} "
                f"busy {s['max_time_ms']:.3f} ms, "
                f"{format_bytes(s['total_bytes'])} moved per step, memory spread {format_bytes(s['memory_spread_bytes'])}, "
                f"{'fits' if s['fits'] else 'DOES NOT FIT'}")

    def __repr__(self) -> str:
        return self._repr_text()


def build_report(plan: ShardingPlan, tables: Sequence[PlannerTable], cost_model: CostModel,
                 result: Optional[PlanningResult] = None, batches: Optional[Sequence[Any]] = None) -> PlanReport:
    import pandas as pd

    topo = cost_model.topology
    W, L = topo.world_size, topo.local_world_size
    if batches is not None:
        if len(batches) != W:
            raise ValueError(f"report: batches has {len(batches)} KJTs; give one per rank ({W})")
        cost = cost_model.evaluate(plan, tables, batch_sizes_of(batches), batch_id_counter(batches))
    else:
        cost = cost_model.evaluate(plan, tables)
    by_key = {t.key: t for t in tables}
    placement_rows = []
    for path, name, ps in plan.items():
        table = by_key[(path, name)]
        for index, shard in enumerate(ps.shards):
            rows, cols = shard.shard_sizes
            parts = cost_model.shard_memory(table, rows, cols, ps.sharding_type, ps.compute_kernel, ps.cache_load_factor)
            placement_rows.append(dict(
                module=path, table=name, shard=index, sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel,
                rank=shard.rank, host=shard.rank // L, row_offset=shard.shard_offsets[0], rows=rows,
                col_offset=shard.shard_offsets[1], columns=cols, weight_bytes=parts["weights"],
                optimizer_bytes=parts["optimizer"], hbm_bytes=parts["hbm"], ddr_bytes=parts["ddr"]))
    placement = pd.DataFrame(placement_rows, columns=[
        "module", "table", "shard", "sharding_type", "compute_kernel", "rank", "host", "row_offset", "rows",
        "col_offset", "columns", "weight_bytes", "optimizer_bytes", "hbm_bytes", "ddr_bytes"])
    hbm_cap, ddr_cap = np.array(topo.hbm_caps()), np.array(topo.ddr_caps())
    memory = pd.DataFrame({"rank": np.arange(W), "host": np.arange(W) // L})
    for part in MEMORY_PARTS:
        memory[part] = cost.memory[part]
    memory["hbm_bytes"], memory["hbm_cap_bytes"] = cost.hbm_bytes, hbm_cap
    memory["hbm_free_bytes"] = hbm_cap - cost.hbm_bytes
    memory["ddr_bytes"], memory["ddr_cap_bytes"] = cost.ddr_bytes, ddr_cap
    memory["ddr_free_bytes"] = ddr_cap - cost.ddr_bytes
    memory["fits"] = (memory["hbm_free_bytes"] >= -1e-6) & (memory["ddr_free_bytes"] >= -1e-6)
    time = pd.DataFrame({"rank": np.arange(W), "host": np.arange(W) // L,
                         "lookup_fwd_ms": cost.lookup_fwd_ms, "lookup_bwd_ms": cost.lookup_bwd_ms})
    for name in COLLECTIVES:
        time[f"{name}_ms"] = cost.comm_ms[name]
    time["comm_ms"] = sum(cost.comm_ms.values())
    time["total_ms"] = cost.time_ms
    traffic = {}
    for name, matrix in cost.traffic.items():
        frame = pd.DataFrame(matrix, index=pd.Index(range(W), name="src"), columns=pd.Index(range(W), name="dst"))
        traffic[name] = frame
    primary = cost.hbm_bytes if topo.uses_hbm else cost.ddr_bytes
    summary = dict(step_time_ms=cost.step_time_ms,
                   max_time_ms=float(cost.time_ms.max()), slowest_rank=int(np.argmax(cost.time_ms)),
                   total_bytes=cost.total_bytes, max_hbm_bytes=float(cost.hbm_bytes.max()),
                   min_hbm_bytes=float(cost.hbm_bytes.min()), max_ddr_bytes=float(cost.ddr_bytes.max()),
                   memory_spread_bytes=float(primary.max() - primary.min()), fits=bool(memory["fits"].all()),
                   objective=result.objective if result is not None else None,
                   profile=str(cost_model.profile.machine.get("source") or cost_model.profile.machine.get("host")
                               or "calibration profile"))
    table_rows = []
    index_of = {t.key: i for i, t in enumerate(tables)}
    for path, name, ps in plan.items():
        table = by_key[(path, name)]
        row = dict(module=path, table=name, rows=table.rows, dim=table.dim, size_bytes=table.weight_bytes,
                   sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel, ranks=list(ps.ranks or []),
                   slowest_ms=None, runner_up=None, runner_up_ms=None, reason=None)
        if result is not None:
            alternatives = table_alternatives(result, index_of[(path, name)])
            chosen = alternatives[0]
            row["slowest_ms"] = chosen["slowest_ms"]
            runner = next((a for a in alternatives[1:] if a["fits"]), None)
            if runner is not None:
                row["runner_up"], row["runner_up_ms"] = runner["option"], runner["slowest_ms"]
            row["reason"] = choice_reason(result, index_of[(path, name)], alternatives)
        table_rows.append(row)
    tables_frame = pd.DataFrame(table_rows, columns=[
        "module", "table", "rows", "dim", "size_bytes", "sharding_type", "compute_kernel", "ranks", "slowest_ms",
        "runner_up", "runner_up_ms", "reason"])
    return PlanReport(placement, memory, time, traffic, tables_frame, summary, step_frame(cost),
                      candidates_frame(result))


STEP_COLUMNS = ("module", "sharding_type", "fixed_ms", "latency_ms", "lookup_fwd_ms", "comm_fwd_ms", "lookup_bwd_ms",
                "comm_bwd_ms", "total_ms")


def step_frame(cost) -> pd.DataFrame:
    """The report's ``step`` frame: the fixed cost per step, then one row per sharding-type group."""
    import pandas as pd

    rows = [dict(module="", sharding_type="per step", fixed_ms=cost.step.step_fixed_ms, latency_ms=0.0,
                 lookup_fwd_ms=0.0, comm_fwd_ms=0.0, lookup_bwd_ms=0.0, comm_bwd_ms=0.0,
                 total_ms=cost.step.step_fixed_ms)]
    rows += [dict(module=g.module_path, sharding_type=g.sharding_type, fixed_ms=g.fixed_ms, latency_ms=g.latency_ms,
                  lookup_fwd_ms=g.lookup_fwd_ms, comm_fwd_ms=g.comm_fwd_ms, lookup_bwd_ms=g.lookup_bwd_ms,
                  comm_bwd_ms=g.comm_bwd_ms, total_ms=g.total_ms) for g in cost.step.groups]
    if cost.step.oversubscription != 1.0:
        rows.append(dict(module="", sharding_type=f"ranks beyond the cores (x{cost.step.oversubscription:.2f})",
                         fixed_ms=0.0, latency_ms=0.0, lookup_fwd_ms=0.0, comm_fwd_ms=0.0, lookup_bwd_ms=0.0,
                         comm_bwd_ms=0.0, total_ms=cost.step.shared_cores_ms))
    if cost.step.load_factor != 1.0 or cost.step.load_factor_alone != 1.0:
        rows.append(dict(module="", sharding_type=f"machine load (x{cost.step.load_factor:.2f}, "
                                                  f"x{cost.step.load_factor_alone:.2f} alone)", fixed_ms=0.0,
                         latency_ms=0.0, lookup_fwd_ms=0.0, comm_fwd_ms=0.0, lookup_bwd_ms=0.0, comm_bwd_ms=0.0,
                         total_ms=cost.step.load_ms))
    return pd.DataFrame(rows, columns=list(STEP_COLUMNS))


def candidates_frame(result: Optional[PlanningResult]) -> pd.DataFrame:
    import pandas as pd

    rows = [] if result is None else [dict(label=c.label, estimated_step_ms=c.estimated_step_ms,
                                           measured_step_ms=c.measured_step_ms, chosen=c.label == result.chosen)
                                      for c in result.candidates]
    return pd.DataFrame(rows, columns=["label", "estimated_step_ms", "measured_step_ms", "chosen"])


def explain_step(result: PlanningResult) -> str:
    """The step estimate of the last plan term by term, the profile's terms, and the candidates compared."""
    cost = result.cost_model.evaluate(result.plan, result.tables)
    lines = [f"Estimated step: {cost.step_time_ms:.3f} ms = fixed per step {cost.step.step_fixed_ms:.3f} ms"
             + "".join(f" + {g.sharding_type} group {g.total_ms:.3f} ms" for g in cost.step.groups)
             + (f" + ranks beyond the cores {cost.step.shared_cores_ms:.3f} ms (each host's "
                f"{result.cost_model.topology.local_world_size * result.cost_model.host_copies} busy ranks on "
                f"{result.cost_model.topology.cores_per_host} cores: the fixed costs, latencies and bytes x "
                f"{cost.step.oversubscription:.2f})" if cost.step.oversubscription != 1.0 else "")
             + (f" + machine load {cost.step.load_ms:.3f} ms (the quiet {cost.step.quiet_ms:.3f} ms x "
                f"(A + (F - A) x S - 1), F = Topology.load_factor {cost.step.load_factor:.2f}, A = load_factor_alone "
                f"{cost.step.load_factor_alone:.2f}, S = this plan's share {cost.step.load_share:.2f}: the other "
                "local ranks' busy share)" if cost.step.load_factor != 1.0 or cost.step.load_factor_alone != 1.0
                else "")]
    lines += _at_calibration_load(cost.step, result.cost_model.profile)
    for g in cost.step.groups:
        lines.append(f"  {g.module_path or '(root)'} {g.sharding_type}: fixed {g.fixed_ms:.3f} + collective latency "
                     f"{g.latency_ms:.3f} + lookups {g.lookup_fwd_ms:.3f} fwd / {g.lookup_bwd_ms:.3f} bwd+update + "
                     f"bytes {g.comm_fwd_ms:.3f} fwd / {g.comm_bwd_ms:.3f} bwd (slowest rank at each)")
    profile = result.cost_model.profile
    lines.append(f"Time terms ({profile.machine.get('source') or 'measured on ' + str(profile.machine.get('host'))}):")
    lines += [f"  {term}: {value}" for term, value in profile.summary_rows()]
    if result.candidates:
        lines.append("Candidate plans (estimated step; measured where run):")
        for c in sorted(result.candidates, key=lambda c: c.estimated_step_ms):
            measured = f", measured {c.measured_step_ms:.3f} ms" if c.measured_step_ms is not None else ""
            mark = "  <- chosen" if c.label == result.chosen else ""
            lines.append(f"  {c.label}: {c.estimated_step_ms:.3f} ms{measured}{mark}")
    if result.timed_out:
        lines.append("The search ran out of timeout_seconds and stopped early: this is the best plan found by then.")
    return "\n".join(lines)


def _at_calibration_load(step: Any, profile: Any) -> List[str]:
    """A quiet estimate's line at the load the calibration probed (profile.machine["load_probe"]): the step a plan
    meets on the machine as it was when calibrated. The terms come from the fastest repeats, so a machine that is
    never quiet (a VM whose two cores run a step 1.4-1.7x slower than their CPU time, idle) is priced below
    what it measures; the planner ranks plans by the quiet estimate. Nothing when the Topology already carries a
    load (at_load) or the profile has no probe."""
    probe = profile.machine.get("load_probe")
    if not isinstance(probe, dict) or "factor" not in probe or (step.load_factor, step.load_factor_alone) != (1.0, 1.0):
        return []
    factor, alone = load_factors(probe)
    at_load = step_at_load(step.quiet_ms, step.load_share, factor, alone)
    return [f"At the load the calibration measured (factor {factor:.2f}, {alone:.2f} with one rank working): "
            f"{at_load:.3f} ms; the estimate above is for a machine of its own, and "
            "topology.at_load(rectoolkit.planner.probe_load(world_size)) prices the load now"]


# ---- alternatives and explanations --------------------------------------------------------------------------
def table_alternatives(result: PlanningResult, table: int) -> List[Dict[str, Any]]:
    """The chosen option first, then the best placement of every other option shape (fastest kernel that
    fits), each with the slowest rank's time after it, or why it does not fit. Sorted by that time."""
    searcher = result.searcher
    chosen = result.assignments[table]
    without = result.state.copy()
    without.apply(chosen, -1.0)
    chosen_ms = float(result.state.time.max())
    out = [dict(option=chosen.option.label, sharding_type=chosen.option.sharding_type.value,
                compute_kernel=chosen.option.compute_kernel.value, fits=True, slowest_ms=chosen_ms,
                locations=chosen.locations, why_not=None)]
    seen = {chosen.option.shape}
    others = []
    for option in searcher.options[table]:
        shape = option.shape
        if shape in seen:
            continue
        placed = searcher.place_option(without, option, table)
        if placed is None:
            others.append((shape, dict(option=option.label, sharding_type=option.sharding_type.value,
                                       compute_kernel=option.compute_kernel.value, fits=False, slowest_ms=None,
                                       locations=None, why_not=_why_not_fit(without, option, result))))
            continue
        seen.add(shape)
        others.append((shape, dict(option=option.label, sharding_type=option.sharding_type.value,
                                   compute_kernel=option.compute_kernel.value, fits=True,
                                   slowest_ms=float(placed[1].time.max()), locations=placed[0], why_not=None)))
    # a shape that fits with a slower kernel is listed once, with that kernel
    others = [o for shape, o in others if o["fits"] or shape not in seen]
    others.sort(key=lambda o: (not o["fits"], o["slowest_ms"] if o["fits"] else 0.0))
    return out + others


def _why_not_fit(state, option: ShardingOption, result: PlanningResult) -> str:
    topo = result.cost_model.topology
    uses_hbm = topo.uses_hbm
    used, cap = (state.hbm, state.hbm_cap) if uses_hbm else (state.ddr, state.ddr_cap)
    need = np.max(option.hbm_bytes if uses_hbm else option.ddr_bytes)
    free = float(np.max(cap - used))
    memory = "HBM" if uses_hbm else "memory"
    if need > free:
        return f"needs {format_bytes(need)} of {memory} on one rank, the most free on any rank is {format_bytes(max(free, 0))}"
    if uses_hbm and np.max(option.ddr_bytes) > float(np.max(state.ddr_cap - state.ddr)):
        return f"needs {format_bytes(np.max(option.ddr_bytes))} of host memory (DDR) on one rank, more than any rank has free"
    return "its groups do not all fit at once (ranks fill up as its shards are placed)"


def time_text(ms: float) -> str:
    """A step time for a sentence, 4 significant digits, in µs below a millisecond (so never 0.005571 ms).

        >>> time_text(0.0055708082490408565), time_text(15.823211669921875), time_text(0.0)
        ('5.571 µs', '15.82 ms', '0 ms')
    """
    return f"{ms * 1000:.4g} µs" if 0 < abs(ms) < 1 else f"{ms:.4g} ms"


def choice_reason(result: PlanningResult, table: int, alternatives: Optional[List[Dict[str, Any]]] = None) -> str:
    """One line: why this table got its option ('row-wise: table is 3.2 GiB, over one rank's 2.0 GiB free')."""
    alternatives = alternatives or table_alternatives(result, table)
    chosen = alternatives[0]
    t = result.tables[table]
    name = chosen["sharding_type"].replace("_", "-")
    tw = next((a for a in alternatives if a["sharding_type"] == "table_wise"), None)
    fitting = [a for a in alternatives[1:] if a["fits"]]
    if len(alternatives) == 1:
        return f"{name}: the only option the constraints allow"
    if chosen["sharding_type"] != "table_wise" and tw is not None and not tw["fits"]:
        return f"{name}: table is {format_bytes(t.weight_bytes)}; table-wise {tw['why_not']}"
    if chosen["compute_kernel"] in ("fused_uvm", "fused_uvm_caching"):
        return f"{name} with {chosen['compute_kernel']}: faster kernels do not fit in HBM"
    if not fitting:
        return f"{name}: no other option fits"
    best_other = fitting[0]
    if result.objective == "time":
        delta = best_other["slowest_ms"] - chosen["slowest_ms"]
        if delta > 1e-12:
            return (f"{name}: slowest rank {time_text(chosen['slowest_ms'])}; the runner-up "
                    f"{best_other['option']} would make it {time_text(best_other['slowest_ms'])}")
        return f"{name}: ties with {best_other['option']} on the slowest rank; it adds less total work"
    return f"{name}: best for the '{result.objective}' objective; runner-up {best_other['option']}"


def explain_table(result: PlanningResult, table_name: str, sharding_type: Union[str, ShardingType, None] = None) -> str:
    matches = [i for i, t in enumerate(result.tables) if table_name in (t.name, t.label)]
    if not matches:
        raise KeyError(f"explain: no table {table_name!r}; tables are {[t.label for t in result.tables]}")
    index = matches[0]
    table = result.tables[index]
    alternatives = table_alternatives(result, index)
    chosen = alternatives[0]
    head = (f"{table.label} ({table.rows} x {table.dim}, {format_bytes(table.weight_bytes)}): chose {chosen['option']} "
            f"on ranks {sorted(set(_ranks_of(result, index)))}; slowest rank {time_text(chosen['slowest_ms'])}. "
            f"{choice_reason(result, index, alternatives)}.")
    if sharding_type is None:
        lines = [head, "Alternatives (slowest rank if only this table changed):"]
        for a in alternatives[1:]:
            lines.append(f"  {a['option']}: " + (time_text(a['slowest_ms']) if a["fits"] else f"does not fit: {a['why_not']}"))
        return "\n".join(lines)
    wanted = ShardingType.parse(sharding_type)
    if wanted.value == chosen["sharding_type"]:
        return head
    c = table.constraints
    if c is not None and c.sharding_types is not None and wanted.value not in c.sharding_types:
        return f"Why not {wanted.name} for {table.label}? The constraints allow only {c.sharding_types}.\n{head}"
    candidates = [a for a in alternatives if a["sharding_type"] == wanted.value]
    if not candidates:
        return (f"Why not {wanted.name} for {table.label}? It is not an option here "
                f"({'sequence tables do not support it' if not table.pooled else 'no kernel or column split allows it'}).\n{head}")
    fitting = [a for a in candidates if a["fits"]]
    if not fitting:
        return f"Why not {wanted.name} for {table.label}? It does not fit: {candidates[0]['why_not']}.\n{head}"
    best = fitting[0]
    if result.objective == "time":
        ratio = best["slowest_ms"] / chosen["slowest_ms"] - 1 if chosen["slowest_ms"] else 0.0
        return (f"Why not {wanted.name} for {table.label}? Its best placement ({best['option']}) makes the slowest rank "
                f"{time_text(best['slowest_ms'])} instead of {time_text(chosen['slowest_ms'])} ({ratio:+.1%}).\n{head}")
    return f"Why not {wanted.name} for {table.label}? The '{result.objective}' objective prefers {chosen['option']}.\n{head}"


def _ranks_of(result: PlanningResult, index: int) -> List[int]:
    table = result.tables[index]
    ps = result.plan.plan[table.module_path][table.name]
    return [s.rank for s in ps.shards]
