"""The explorer's one door into the core: settings -> planner -> plan + report frames (no widget code).

Settings map onto the planner like this: world size, ranks per host and batch size go to `Topology`;
memory per rank is `hbm_cap` on "cuda" and `ddr_cap` on "cpu"; optimizer and objective go to
`EmbeddingShardingPlanner`; a forced sharding type becomes `ParameterConstraints(sharding_types=[...])`;
hand moves from the placement board edit the plan, which `planner.report(plan)` then prices.

Everything the PlanExplorer shows comes from `plan_and_report(settings, table_set)`, so a notebook (or a
test) can get the same plan and DataFrames without a widget:

    result = plan_and_report(ExplorerSettings(world_size=4), as_table_set("dlrm26"))
    result.plan, result.memory, result.time, result.comm, result.choices
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from rectoolkit.plan.types import ShardingPlan, ShardingType
from rectoolkit.viz.frames import placement_frame
from rectoolkit.plan.edits import MoveError, move_shard
from rectoolkit.widgets.inputs import TableSet

GIB = 1024 ** 3
AUTO = "auto"


@dataclass
class ExplorerSettings:
    """What the explorer's controls set. `forced` maps table -> sharding type (TorchRec string)."""

    world_size: int = 2
    local_world_size: int = 2
    memory_per_rank_gib: float = 16.0
    batch_size: int = 512
    optimizer: str = "sgd"
    objective: str = "time"
    compute_device: str = "cuda"
    forced: Dict[str, str] = field(default_factory=dict)
    moves: List[Tuple[str, int, int]] = field(default_factory=list)
    local_search: bool = True  # False: the planner's greedy pass only (several times faster, slightly worse)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world size must be at least 1, got {self.world_size}")
        if self.local_world_size < 1 or self.world_size % self.local_world_size:
            raise ValueError(f"ranks per host ({self.local_world_size}) must divide the world size "
                             f"({self.world_size}); try {self.world_size} or a divisor of it")
        if self.memory_per_rank_gib <= 0:
            raise ValueError(f"memory per rank must be positive, got {self.memory_per_rank_gib} GiB")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")

    def with_changes(self, **changes: Any) -> "ExplorerSettings":
        return replace(self, **changes)

    @property
    def memory_per_rank_bytes(self) -> int:
        return int(self.memory_per_rank_gib * GIB)


@dataclass
class PlanningResult:
    """A plan and its report, or the error that stopped planning (a message, never a traceback)."""

    settings: ExplorerSettings
    plan: Optional[ShardingPlan] = None
    report: Any = None
    placement: Optional[pd.DataFrame] = None
    memory: Optional[pd.DataFrame] = None
    time: Optional[pd.DataFrame] = None
    comm: Optional[Dict[str, np.ndarray]] = None
    choices: Optional[pd.DataFrame] = None
    error: Optional[str] = None
    notes: List[str] = field(default_factory=list)
    planner: Any = None
    choices_with_reasons: Optional[pd.DataFrame] = None  # filled by full_choices() on demand

    @property
    def ok(self) -> bool:
        return self.error is None and self.plan is not None


# ----------------------------------------------------------------------------------------------- planner calls


def build_topology(settings: ExplorerSettings, profile: Any = None):
    """The planner's Topology: memory per rank is HBM on "cuda" and host memory (DDR) on "cpu"; `profile`: the
    calibration profile its time estimates use (rectoolkit.planner.profile; None: TorchRec's bandwidth terms)."""
    from rectoolkit.planner import Topology

    memory = settings.memory_per_rank_bytes
    on_gpu = settings.compute_device != "cpu"
    return Topology(world_size=settings.world_size, compute_device=settings.compute_device,
                    local_world_size=settings.local_world_size, batch_size=settings.batch_size,
                    hbm_cap=memory if on_gpu else None, ddr_cap=None if on_gpu else memory, profile=profile)


def build_constraints(settings: ExplorerSettings, table_set: TableSet) -> Dict[str, Any]:
    """ParameterConstraints for the tables whose sharding type is forced."""
    from rectoolkit.planner import ParameterConstraints

    names = {t.name for t in table_set.tables}
    unknown = sorted(set(settings.forced) - names)
    if unknown:
        raise KeyError(f"forced sharding types name unknown tables {unknown}; tables are {sorted(names)}")
    return {table: ParameterConstraints(sharding_types=[ShardingType.parse(kind).value])
            for table, kind in settings.forced.items() if kind and kind != AUTO}


def make_planner(settings: ExplorerSettings, table_set: TableSet, profile: Any = None):
    from rectoolkit.planner import EmbeddingShardingPlanner, WorkloadStats

    stats = WorkloadStats(pooling_factors=dict(table_set.pooling_factors))  # the batch size: the planner's
    return EmbeddingShardingPlanner(build_topology(settings, profile), batch_size=settings.batch_size,
                                    constraints=build_constraints(settings, table_set),
                                    objective=settings.objective, optimizer=settings.optimizer, stats=stats,
                                    dense_bytes_per_rank=None if table_set.module is not None else 0.0,
                                    local_search=settings.local_search)


def plan_and_report(settings: ExplorerSettings, table_set: TableSet, profile: Any = None) -> PlanningResult:
    """Plan the tables under `settings` (time terms from `profile`, a CalibrationProfile), apply hand moves, and
    collect the report's frames.

    Planner errors (PlannerError, ValueError, ...) come back in `result.error` with the planner's explanation.
    """
    result = PlanningResult(settings=settings)
    try:
        planner = make_planner(settings, table_set, profile)
        plan = planner.plan(table_set.planner_input)
        if settings.moves:
            plan = _apply_moves(settings, plan, result.notes)
        # the report without per-table runner-ups is several times cheaper; `full_choices` adds them on demand
        report = planner.report(plan, runner_ups=False)
    except Exception as error:  # the widget shows the message; nothing escapes as a traceback
        result.error = _describe(error)
        return result
    result.planner = planner
    _fill(result, plan, report, table_set)
    return result


def measure_current_and_pinned(result: PlanningResult, table_set: TableSet, baseline: Optional[ShardingPlan],
                               profile: Any = None, steps: int = 5, rounds: int = 2):
    """Run the current plan (and the pinned baseline) on local CPU workers: rectoolkit.planner.measure_plans,
    estimates from the same topology on CPU with `profile`. Returns its PlanMeasurements."""
    from rectoolkit.modules.configs import EmbeddingBagConfig
    from rectoolkit.planner import measure_plans

    if not result.ok:
        raise ValueError(f"nothing to measure: {result.error}")
    if not all(isinstance(t, EmbeddingBagConfig) for t in table_set.tables):
        raise ValueError("Measure runs EmbeddingBagCollection tables; these include sequence tables")
    plans = {"current": result.plan}
    if baseline is not None and baseline.plan != result.plan.plan:
        plans["pinned"] = baseline
    settings = result.settings.with_changes(compute_device="cpu")
    factors = {f: float(table_set.pooling_factors.get(f, 1.0)) for t in table_set.tables for f in t.feature_names}
    return measure_plans(plans, table_set.tables, settings.world_size, steps=steps, rounds=rounds,
                         batch_size=settings.batch_size, pooling_factors=factors,
                         topology=build_topology(settings, profile), optimizer=settings.optimizer)


def full_choices(result: PlanningResult) -> Optional[pd.DataFrame]:
    """Per-table choices with the runner-up and the reason (the planner's full report of its own plan).

    For a plan edited by hand on the board, the runner-ups describe the planner's plan before the edits.
    """
    if result.planner is None:
        return result.choices
    if result.choices_with_reasons is None:
        full = result.planner.report().tables
        edited = result.choices.set_index("table") if result.choices is not None else None
        if edited is not None and result.settings.moves:  # show the edited placement, keep the planner's reasons
            full = full.assign(ranks=[edited.loc[t, "ranks"] for t in full["table"]])
        result.choices_with_reasons = full
    return result.choices_with_reasons


def _apply_moves(settings: ExplorerSettings, plan: ShardingPlan, notes: List[str]) -> ShardingPlan:
    kept = []
    for table, shard, rank in settings.moves:
        try:
            plan = move_shard(plan, table, shard, rank, world_size=settings.world_size,
                              local_world_size=settings.local_world_size)
            kept.append((table, shard, rank))
        except (MoveError, KeyError) as error:
            notes.append(f"dropped the hand move of {table} shard {shard} to rank {rank}: {error}")
    settings.moves[:] = kept
    if kept:
        notes.append(f"{len(kept)} shard(s) placed by hand on the board; the report prices the edited plan")
    return plan


def _describe(error: BaseException) -> str:
    name = type(error).__name__
    return str(error) if name == "PlannerError" else f"{name}: {error}"


def _fill(result: PlanningResult, plan: ShardingPlan, report: Any, table_set: TableSet) -> None:
    result.plan, result.report = plan, report
    result.placement = placement_frame(plan, table_set.tables)
    result.memory = report.memory
    result.time = report.time
    result.comm = {name: frame.to_numpy() for name, frame in report.traffic.items()}
    result.choices = report.tables


# ----------------------------------------------------------------------------------------------- save / export


def plan_to_json(plan: ShardingPlan, tables: Any = None) -> str:
    """The plan as JSON text in the core's format (with the tables' shapes, so loading can check them)."""
    from rectoolkit.plan.serialization import plan_to_json as to_json

    return to_json(plan, tables)


def plan_from_json(text: str, tables: Any = None, source: str = "plan") -> ShardingPlan:
    from rectoolkit.plan.serialization import plan_from_json as from_json

    return from_json(text, tables, source=source)


def torchrec_export_text(plan: ShardingPlan, plan_path: str = "plan.json") -> str:
    """How the plan reads in TorchRec: its printed plan (from the TorchRec object when TorchRec is installed)
    and the lines that load the saved JSON as a TorchRec ShardingPlan."""
    header = ["# Load the saved plan as a TorchRec ShardingPlan:",
              "from rectoolkit.plan.serialization import load_plan",
              "from rectoolkit.plan.torchrec_interop import to_torchrec",
              f"torchrec_plan = to_torchrec(load_plan({plan_path!r}))",
              "# then: DistributedModelParallel(model, plan=torchrec_plan, ...)", ""]
    try:
        from rectoolkit.plan.torchrec_interop import to_torchrec

        body = ["# print(torchrec_plan):", str(to_torchrec(plan))]
    except ImportError as error:
        body = [f"# TorchRec is not installed here ({error}); TorchRec prints the same plan as:", str(plan)]
    return "\n".join(header + body)


def settings_summary(settings: ExplorerSettings) -> Dict[str, Any]:
    return asdict(settings)
