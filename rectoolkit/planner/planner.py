"""EmbeddingShardingPlanner: tables + topology + constraints -> ShardingPlan, with a report and explanations.

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16, feature_names=[f"f{i}"])
    ...           for i in range(4)]
    >>> planner = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu", ddr_cap=10**9))
    >>> plan = planner.plan(tables)
    >>> sorted(plan.plan[""])
    ['t0', 't1', 't2', 't3']
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.plan.types import EmbeddingModuleShardingPlan, ShardingPlan, ShardingType
from rectoolkit.planner.constraints import ParameterConstraints
from rectoolkit.planner.cost import CostModel, id_senders, shard_ids
from rectoolkit.planner.interface import ShardingPlanner
from rectoolkit.planner.enumerate import ShardingOption, enumerate_options, to_parameter_sharding
from rectoolkit.planner.search import Searcher
from rectoolkit.planner.state import Assignment, SearchState
from rectoolkit.planner.stats import WorkloadStats, split_planner_stats
from rectoolkit.planner.tables import PlannerTable, apply_sharders, at_wrapper_paths, collect_tables
from rectoolkit.planner.topology import Topology

_LOG = logging.getLogger("rectoolkit.planner")
CANDIDATE_INSTANCE = 4096  # tables x ranks up to which one search per sharding type runs (planning time)
CANDIDATE_TYPES = (ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE,
                   ShardingType.TABLE_ROW_WISE, ShardingType.DATA_PARALLEL)
_TORCHREC_ONLY_ARGS = ("enumerator", "storage_reservation", "proposer", "partitioner", "performance_model",
                       "callbacks", "heuristical_storage_reservation_percentage")


class PlannerErrorType(Enum):
    """What kind of planning failure a PlannerError is (TorchRec's names and values)."""

    INSUFFICIENT_STORAGE = "insufficient_storage"
    STRICT_CONSTRAINTS = "strict_constraints"
    PARTITION = "partition"
    OTHER = "other"
    PLANNER_INPUT_CONTEXT_MISMATCH = "planner_input_context_mismatch"
    PLAN_LOADING_FAILED = "plan_loading_failed"
    INVALID_RANK_ASSIGNMENT = "invalid_rank_assignment"
    INPUT_VALIDATION = "input_validation"
    MISSING_MODULE_IN_PLAN = "missing_module_in_plan"
    INVALID_COMPUTE_KERNEL = "invalid_compute_kernel"


class PlannerError(ValueError):
    """No plan fits. TorchRec's arguments first (`message`, `error_type`: a PlannerErrorType); then `tables`: the
    tables that do not fit; `shortfall_bytes`: rank -> bytes over capacity when they are forced in at their
    smallest; `suggestions`: what would make it fit."""

    def __init__(self, message: str, error_type: "PlannerErrorType" = PlannerErrorType.OTHER,
                 tables: Sequence[str] = (), shortfall_bytes: Optional[Dict[int, float]] = None,
                 suggestions: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.tables = list(tables)
        self.shortfall_bytes = dict(shortfall_bytes or {})
        self.suggestions = list(suggestions)


@dataclass
class CandidatePlan:
    """A whole plan the planner priced (and maybe ran) before choosing: `label` says which search made it."""

    label: str
    plan: ShardingPlan
    estimated_step_ms: float
    measured_step_ms: Optional[float] = None


@dataclass
class PlanningResult:
    """Everything one plan() call worked out, for reports and explanations."""

    tables: List[PlannerTable]
    options: List[List[ShardingOption]]
    assignments: Dict[int, Assignment]
    state: SearchState
    searcher: Searcher
    cost_model: CostModel
    plan: ShardingPlan
    objective: str
    candidates: List[CandidatePlan] = field(default_factory=list)  # cheapest estimate first; the chosen is marked
    chosen: str = "search"  # the label of the candidate returned
    measurements: Any = None  # measure_top_k's DataFrame (rectoolkit.planner.measure), when it ran
    timed_out: bool = False  # timeout_seconds ran out: the search stopped early (see EmbeddingShardingPlanner)


@contextlib.contextmanager
def _gc_paused():
    """Python's cyclic garbage collector off while planning (back as it was after): a plan allocates 10^5-10^6
    small objects that form no cycles (options, shards, lists), and the collector's passes over them took about half
    of the planning time at 1000 tables x 512 ranks (benchmarks/RESULTS.md, "Planning time")."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class EmbeddingShardingPlanner(ShardingPlanner):
    """Plans how to shard every embedding table (TorchRec's class name and calls).

    Args:
        topology: ranks, hosts, memory and bandwidths (default: this process group's world, cuda if available).
        batch_size: samples per rank (default: stats.batch_size, else the topology's; resolve_batch_size).
        constraints: table name -> ParameterConstraints.
        objective: "time" (slowest rank's step time, default), "memory" (balance memory), "bytes" (total moved).
        optimizer: embedding optimizer, for optimizer-state memory ("sgd", "adagrad", "row_wise_adagrad", "adam").
        stats: WorkloadStats (pooling factors, batch size), e.g. WorkloadStats.from_batches(sample_kjts); or, as in
            TorchRec, statistics printers: EmbeddingStats() (logs explain() after each plan) / NoopEmbeddingStats().
        dense_bytes_per_rank: bytes of dense replicas per rank (default: a module's non-embedding parameters,
            weights + gradients, fp32).
        local_search: improve the greedy plan by moves and swaps (default True).
        measure_top_k: after pricing the candidate plans (below), run the k with the lowest estimated step time for
            a few steps on local workers (rectoolkit.planner.measure.measure_plans) and return the measured-fastest;
            the measurements are in `planner.last.measurements` and the report. 0 (default): no runs.
        measure_steps: timed steps per candidate when measuring.
        debug: log `explain()` (logger "rectoolkit.planner", INFO) after every plan, as TorchRec's debug logs its stats.
        storage_reservation: memory kept free of tables (rectoolkit.planner.storage_reservations: TorchRec's
            FixedPercentage / FixedAbsolute / HeuristicalStorageReservation); default none (TorchRec's default
            planner keeps 15% of HBM: pass HeuristicalStorageReservation(0.15) for its plans near capacity).
            heuristical_storage_reservation_percentage=p is HeuristicalStorageReservation(p).
        timeout_seconds: as TorchRec's, a time limit (seconds > 0) on the search: once it runs out, plan() stops
            improving (no more local-search rounds, restarts or whole-plan candidates) and returns the best plan so
            far; the first greedy placement always completes. `planner.last.timed_out` says whether it ran out
            (and it is logged, logger "rectoolkit.planner"). measure_top_k's runs are not bounded by it.
        TorchRec's other planner components (enumerator, proposer, partitioner, performance_model, callbacks)
        are refused with NotImplementedError unless None: this planner has its own.

    With a calibration profile on the topology (Topology.calibrate(), or Topology(profile=path)) and the "time"
    objective, the search runs once freely and once per sharding type (each table limited to that type where it
    allows it), and the whole plans are priced by the step estimate (CostModel.evaluate: fixed costs per step and
    per sharding-type group, collective latencies, the slowest rank at each collective); the cheapest is returned.
    The per-rank sums the search balances cannot see that mixing sharding types adds groups, or that ranks wait
    for each other at every collective.
    """

    def __init__(self, topology: Optional[Topology] = None, batch_size: Optional[int] = None,
                 constraints: Optional[Mapping[str, ParameterConstraints]] = None, *, objective: str = "time",
                 optimizer: Union[str, EmbOptimType] = EmbOptimType.SGD, stats: Optional[WorkloadStats] = None,
                 dense_bytes_per_rank: Optional[float] = None, local_search: bool = True, debug: bool = False,
                 measure_top_k: int = 0, measure_steps: int = 10, timeout_seconds: Optional[float] = None,
                 **torchrec_args: Any) -> None:
        unknown = set(torchrec_args) - set(_TORCHREC_ONLY_ARGS)
        if unknown:
            raise TypeError(f"EmbeddingShardingPlanner got unexpected arguments {sorted(unknown)}")
        self.storage_reservation = _storage_reservation(torchrec_args.pop("storage_reservation", None),
                                                        torchrec_args.pop("heuristical_storage_reservation_percentage",
                                                                          None))
        components = sorted(name for name, value in torchrec_args.items() if value is not None)
        if components:
            raise NotImplementedError(
                f"EmbeddingShardingPlanner: {components} replace parts of TorchRec's planner, which rectoolkit's planner "
                "does not have (its own search and cost model: see constraints=, objective=, Topology(profile=...)). "
                "Leave them out, or plan with TorchRec's planner and read its plan with "
                "rectoolkit.plan.torchrec_interop.from_torchrec")
        self.topology = topology if topology is not None else _default_topology()
        stats, self.stats_printers = split_planner_stats(stats)
        self.batch_size = resolve_batch_size(batch_size, stats, self.topology)
        self.constraints = dict(constraints or {})
        for name, c in self.constraints.items():
            if not isinstance(c, ParameterConstraints):
                raise TypeError(f"constraints[{name!r}] is a {type(c).__name__}, not a ParameterConstraints")
        self.objective = objective
        self.optimizer = EmbOptimType.parse(optimizer)
        self.stats = stats
        self.dense_bytes_per_rank = dense_bytes_per_rank
        self.local_search = local_search
        self.debug = bool(debug)  # True: every plan() logs explain() (the step estimate, terms, candidates)
        if not isinstance(measure_top_k, int) or measure_top_k < 0:
            raise ValueError(f"measure_top_k must be an int >= 0 (candidates to run), got {measure_top_k!r}")
        if not isinstance(measure_steps, int) or measure_steps < 1:
            raise ValueError(f"measure_steps must be an int >= 1, got {measure_steps!r}")
        if measure_top_k and objective != "time":
            raise ValueError(f"measure_top_k measures step time; it needs objective='time', not {objective!r}")
        self.measure_top_k = measure_top_k
        self.measure_steps = measure_steps
        if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or
                                            not isinstance(timeout_seconds, (int, float)) or not timeout_seconds > 0):
            raise ValueError(f"timeout_seconds must be a number of seconds > 0 (or None: no limit), got "
                             f"{timeout_seconds!r}")
        self.timeout_seconds = timeout_seconds
        self.last: Optional[PlanningResult] = None

    # ---- planning ---------------------------------------------------------------------------------------
    def plan(self, module: Any, sharders: Optional[Sequence[Any]] = None) -> ShardingPlan:
        """A ShardingPlan for every table of `module` (a model, a list of configs or a DataFrame of tables).

        `sharders` (TorchRec's or rectoolkit.distributed.sharders'), when given, limit each table to the sharding
        types its collection's sharder supports on the topology's device; None allows every type.
        """
        with _gc_paused(), self._reserved(module):
            return self._plan(module, sharders)

    @contextlib.contextmanager
    def _reserved(self, module: Any):
        """While planning `module`: the topology and dense bytes after the storage reservation."""
        if self.storage_reservation is None:
            yield
            return
        saved = self.topology, self.dense_bytes_per_rank
        dense = saved[1] if saved[1] is not None else _dense_parameter_bytes(module)
        self.topology, self.dense_bytes_per_rank = self.storage_reservation.reserve_for(
            saved[0], _dense_parameter_bytes(module) / 2, dense)
        try:
            yield
        finally:
            self.topology, self.dense_bytes_per_rank = saved

    def _plan(self, module: Any, sharders: Optional[Sequence[Any]]) -> ShardingPlan:
        deadline = None if self.timeout_seconds is None else time.monotonic() + self.timeout_seconds
        tables = at_wrapper_paths(collect_tables(module, self.batch_size, self.constraints, self.stats), module, sharders)
        unsharded: List[PlannerTable] = []
        if sharders is not None:
            planned = apply_sharders(tables, sharders, self.topology.compute_device)
            keys = {t.key for t in planned}
            unsharded = [t for t in tables if t.key not in keys]  # no sharder: a replica on every rank, as dense
            if unsharded:
                _LOG.info("no sharder for %s: not planned, left unsharded", [t.label for t in unsharded])
            tables = planned
        _check_device_groups(tables, self.topology.compute_device)
        dense = self.dense_bytes_per_rank
        if dense is None:
            dense = _dense_parameter_bytes(module) + sum(_replica_bytes(t) for t in unsharded)
        if not tables:  # nothing to shard (TorchRec: an empty plan)
            self.last = None
            return ShardingPlan({})
        cost_model = CostModel(self.topology.with_batch_size(self.batch_size), self.optimizer, dense, tables)
        options = []
        for index, table in enumerate(tables):
            try:
                options.append(enumerate_options(table, index, self.topology))
            except ValueError as error:  # constraints that allow nothing: name the table and the constraint
                raise PlannerError(str(error), PlannerErrorType.STRICT_CONSTRAINTS, [table.label]) from None

        def fill(batch: List[ShardingOption]) -> None:
            cost_model.fill_many(batch, [tables[o.table_index] for o in batch])

        hbm_base = dense if self.topology.uses_hbm else 0.0
        ddr_base = 0.0 if self.topology.uses_hbm else dense
        allowed = [t.constraints.ranks if t.constraints is not None else None for t in tables]
        searcher = Searcher(self.topology, options, self.objective, hbm_base, ddr_base, allowed, fill, deadline)
        assignments, unplaced, state = searcher.run(local_search=self.local_search)
        if unplaced:
            raise _no_fit_error(tables, options, unplaced, assignments, searcher, self)
        plan = build_plan(tables, assignments, self.topology)
        result = PlanningResult(tables, options, assignments, state, searcher, cost_model, plan, self.objective)
        if self.objective == "time" and (self.topology.profile is not None or self.measure_top_k):
            result = self._choose_candidate(result, hbm_base, ddr_base, allowed, fill, deadline)
        result.timed_out = searcher.timed_out or (deadline is not None and time.monotonic() > deadline)
        if result.timed_out:
            _LOG.info("planning exceeded timeout_seconds=%s: returned the best plan found by then",
                      self.timeout_seconds)
        self.last = result
        if self.debug:
            _LOG.info("%s", self.explain())
        for printer in self.stats_printers:
            printer.log_plan(self)
        return result.plan

    def _choose_candidate(self, result: PlanningResult, hbm_base: float, ddr_base: float, allowed, fill,
                          deadline: Optional[float] = None) -> PlanningResult:
        """Price whole candidate plans by the step estimate (and run the best measure_top_k); keep the fastest."""
        found = {"search": (result.assignments, result.state, result.searcher)}
        if len(result.tables) * self.topology.world_size <= CANDIDATE_INSTANCE or self.measure_top_k:
            for kind in CANDIDATE_TYPES:
                if deadline is not None and time.monotonic() > deadline:
                    break  # timeout_seconds: the candidates searched so far are priced
                limited = [[o for o in opts if o.sharding_type == kind] or list(opts) for opts in result.options]
                if all(len(a) == len(b) for a, b in zip(limited, result.options)):
                    continue  # no table allows this type alone, or every table already has only it
                searcher = Searcher(self.topology, limited, self.objective, hbm_base, ddr_base, allowed, fill,
                                    deadline)
                assignments, unplaced, state = searcher.run(local_search=self.local_search)
                if not unplaced:
                    found[f"{kind.value} where allowed"] = (assignments, state, searcher)
        if len(found) == 1 and not self.measure_top_k:
            return result  # a large instance: nothing to compare (pricing whole plans costs more than the search)
        plans = {label: build_plan(result.tables, a, self.topology) for label, (a, _, _) in found.items()}
        candidates, seen = [], set()
        for label, plan in plans.items():
            key = repr(plan.plan)
            if key in seen:
                continue
            seen.add(key)
            candidates.append(CandidatePlan(label, plan, result.cost_model.evaluate(plan, result.tables).step_time_ms))
        candidates.sort(key=lambda c: c.estimated_step_ms)
        chosen = candidates[0]
        measurements = None
        if self.measure_top_k:
            chosen, measurements = self._measure(candidates[:self.measure_top_k], result.tables)
        assignments, state, searcher = found[chosen.label]
        return PlanningResult(result.tables, result.options, assignments, state, searcher, result.cost_model,
                              chosen.plan, self.objective, candidates, chosen.label, measurements)

    def _measure(self, candidates: List[CandidatePlan], tables: List[PlannerTable]):
        """Run the candidates on local workers (measure_plans); the measured-fastest and the evidence."""
        from rectoolkit.modules.configs import EmbeddingBagConfig
        from rectoolkit.planner.measure import pick_measured_fastest

        configs = [t.config for t in tables]
        if len({t.module_path for t in tables}) > 1 or not all(isinstance(c, EmbeddingBagConfig) for c in configs):
            raise ValueError("measure_top_k runs one EmbeddingBagCollection's tables; this model has "
                             f"{len({t.module_path for t in tables})} collections or sequence tables: plan without "
                             "measure_top_k, then rectoolkit.planner.measure_plans on what you want measured")
        if any(t.qcomm_codecs_registry is not None for t in tables):
            raise NotImplementedError("measure_top_k runs the candidates with float32 output exchanges, but the "
                                      "sharder has a qcomm_codecs_registry; plan without measure_top_k (the cost "
                                      "model prices the registry's precisions)")
        factors = {f: p for t in tables for f, p in zip(t.config.feature_names, t.pooling_factors)}
        topology = self.topology.with_batch_size(self.batch_size)
        _, evidence = pick_measured_fastest({c.label: c.plan for c in candidates}, configs, topology.world_size,
                                            steps=self.measure_steps, batch_size=self.batch_size,
                                            pooling_factors=factors, topology=topology, optimizer=self.optimizer.value)
        measured = evidence.plans.set_index("plan")["step_ms"]
        for candidate in candidates:
            candidate.measured_step_ms = float(measured[candidate.label])
        return next(c for c in candidates if c.label == evidence.info["picked"]), evidence

    def collective_plan(self, module: Any, sharders: Optional[Sequence[Any]] = None, pg: Any = None) -> ShardingPlan:
        """TorchRec's collective_plan: rank 0 of `pg` (default: the default group) plans, every rank gets its plan
        (broadcast), so the ranks agree even when planning measured timings. Without torch.distributed: plan()."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return self.plan(module, sharders)
        box = [self.plan(module, sharders) if dist.get_rank(pg) == 0 else None]
        if dist.get_world_size(pg) > 1:
            dist.broadcast_object_list(box, src=dist.get_global_rank(pg, 0) if pg is not None else 0, group=pg)
        return box[0]

    # ---- reports --------------------------------------------------------------------------------------------
    def report(self, plan: Optional[ShardingPlan] = None, batches: Optional[Sequence[Any]] = None,
               tables: Any = None, runner_ups: bool = True):
        """A PlanReport of `plan` (default: the last plan). `batches`: one KJT per rank for exact bytes;
        `tables`: the tables, for a plan that did not come from this planner (e.g. from TorchRec);
        `runner_ups=False` leaves out each table's runner-up and reason (most of a report's time; they
        exist only for the planner's own last plan)."""
        from rectoolkit.planner.report import build_report

        if plan is None and self.last is None:
            raise ValueError("report(): no plan yet; call planner.plan(tables) first or pass a plan")
        result = self.last
        if tables is not None:
            planner_tables = collect_tables(tables, self.batch_size, self.constraints, self.stats)
            dense = self.dense_bytes_per_rank
            cost_model = CostModel(self.topology, self.optimizer,
                                   _dense_parameter_bytes(tables) if dense is None else dense, planner_tables)
            result = None
        else:
            if result is None:
                raise ValueError("report(plan): pass tables=... too; this planner has not planned these tables")
            planner_tables, cost_model = result.tables, result.cost_model
        own_plan = plan is None or (result is not None and plan is result.plan)
        return build_report(plan if plan is not None else result.plan, planner_tables, cost_model,
                            result if own_plan and runner_ups else None, batches)

    @property
    def last_report(self):
        return self.report() if self.last is not None else None

    def explain(self, table: Optional[str] = None, sharding_type: Union[str, ShardingType, None] = None) -> str:
        """Why the last plan chose what it chose for `table`, or why not `sharding_type`; without a table, the
        step estimate term by term, the calibration terms in use and the candidate plans compared."""
        from rectoolkit.planner.report import explain_step, explain_table

        if self.last is None:
            raise ValueError("explain(): no plan yet; call planner.plan(tables) first")
        if table is None:
            if sharding_type is not None:
                raise ValueError("explain(sharding_type=...) needs the table it is about: explain(table, sharding_type)")
            return explain_step(self.last)
        return explain_table(self.last, table, sharding_type) + "\n" + _shard_terms(self.last, table)


def resolve_batch_size(batch_size: Optional[int], stats: Optional[WorkloadStats], topology: Topology) -> int:
    """The one batch size (samples per rank) the planner plans for: its `batch_size` argument, else the workload
    statistics', else the topology's. An argument and statistics that disagree are refused.

    >>> resolve_batch_size(None, WorkloadStats({}, batch_size=256), Topology(world_size=2))
    256
    """
    from_stats = stats.batch_size if stats is not None and stats.batch_size else None
    if batch_size is not None and from_stats is not None and int(batch_size) != int(from_stats):
        raise ValueError(f"EmbeddingShardingPlanner: batch_size={batch_size} but stats.batch_size={from_stats}; "
                         "give the batch size once (either one, or both equal)")
    chosen = batch_size if batch_size is not None else from_stats if from_stats is not None else topology.batch_size
    if isinstance(chosen, bool) or not isinstance(chosen, (int, np.integer)) or chosen <= 0:
        raise ValueError(f"EmbeddingShardingPlanner: batch_size must be a positive int, got {chosen!r}")
    return int(chosen)


def build_plan(tables: Sequence[PlannerTable], assignments: Mapping[int, Assignment], topology: Topology) -> ShardingPlan:
    modules: Dict[str, EmbeddingModuleShardingPlan] = {}
    for index, table in enumerate(tables):
        a = assignments[index]
        modules.setdefault(table.module_path, EmbeddingModuleShardingPlan())[table.name] = to_parameter_sharding(
            a.option, table, a.locations, topology)
    return ShardingPlan(modules)


def _shard_terms(result: PlanningResult, table_name: str) -> str:
    """The time terms of one table's shards in the last plan (read speed at their size, fixed, backward)."""
    table = next(t for t in result.tables if table_name in (t.name, t.label))
    ps = result.plan.plan[table.module_path][table.name]
    model = result.cost_model
    replica = ps.sharding_type == ShardingType.DATA_PARALLEL.value  # its update: the dense optimizer's (cost.py)
    back = model.replica_backward_terms if replica else model.backward_terms
    update = "gradient rows (priced as sgd's)" if replica else f"{model.optimizer.value} update"
    lines = [f"Time terms of its shards ({ps.sharding_type}, fixed {model.profile.shard_ms:.3f} ms per shard; backward + "
             f"{update}: {back.id_ms * 1e6:.1f} ns per id, row reads x {back.read_factor:.2f}, "
             f"{back.output_ms_per_byte * 1e6:.3f} ns per output byte):"]
    senders = id_senders(ps.sharding_type, model.topology.world_size)
    for shard in ps.shards:
        rows, cols = shard.shard_sizes
        forward, backward = model.shard_lookup_ms(table, rows, cols, ps.sharding_type, ps.compute_kernel,
                                                  ps.cache_load_factor)
        size = rows * cols * table.element_bytes
        ids = shard_ids(table.ids_per_rank, senders, rows, table.rows)
        lines.append(f"  rank {shard.rank}: {rows} x {cols} ({format_bytes(size)}), {ids:,.0f} ids reading "
                     f"{float(model.profile.rows_read(ids, rows)):,.0f} rows at "
                     f"{1 / model.profile.read_ms_per_byte(size) / 1e6:.2f} GB/s: {forward:.3f} ms forward, "
                     f"{backward:.3f} ms backward + update")
    return "\n".join(lines)


def _default_topology() -> Topology:
    import torch
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return Topology(world_size=world, compute_device="cuda" if torch.cuda.is_available() else "cpu")


def _check_device_groups(tables: Sequence[PlannerTable], compute_device: str) -> None:
    """A table constrained to another device group than the topology's: TorchRec's planner leaves it for the
    planner of that group, which leaves the collection partly planned; rectoolkit plans one device group."""
    others = [f"{t.label} (device_group={t.constraints.device_group!r})" for t in tables
              if t.constraints is not None and t.constraints.device_group not in (None, compute_device)]
    if others:
        raise PlannerError(f"tables {', '.join(others)} belong to another device group than the topology's "
                           f"compute_device {compute_device!r}; rectoolkit plans every table on one device group: "
                           f"leave device_group None (or {compute_device!r})", PlannerErrorType.INPUT_VALIDATION,
                           [t.split(' ')[0] for t in others])


def _storage_reservation(reservation: Any, percentage: Optional[float]) -> Any:
    """The planner's storage reservation: `reservation` (one of rectoolkit.planner.storage_reservations'), or
    HeuristicalStorageReservation(percentage) when only TorchRec's heuristical_storage_reservation_percentage is
    given."""
    from rectoolkit.planner.storage_reservations import HeuristicalStorageReservation, StorageReservation

    if reservation is None:
        return HeuristicalStorageReservation(percentage) if percentage is not None else None
    if not isinstance(reservation, StorageReservation):
        raise TypeError(f"EmbeddingShardingPlanner: storage_reservation={type(reservation).__name__} is not one of "
                        "rectoolkit's; use FixedPercentageStorageReservation, FixedAbsoluteStorageReservation or "
                        "HeuristicalStorageReservation from rectoolkit.planner.storage_reservations (TorchRec's path "
                        "torchrec.distributed.planner.storage_reservations)")
    return reservation


def _dense_parameter_bytes(module: Any) -> float:
    """fp32 weights + gradients of a module's parameters outside its embedding collections."""
    if not hasattr(module, "named_modules"):
        return 0.0
    embedding_params = set()
    for _, sub in module.named_modules():
        if callable(getattr(sub, "embedding_bag_configs", None)) or callable(getattr(sub, "embedding_configs", None)):
            embedding_params.update(id(p) for p in sub.parameters())
    dense = sum(p.numel() for p in module.parameters() if id(p) not in embedding_params)
    return float(dense * 4 * 2)


def _replica_bytes(table: PlannerTable) -> float:
    """fp32 weights + gradients of a whole table kept unsharded on every rank (counted as dense, as above)."""
    return float(table.config.num_embeddings * table.config.embedding_dim * 4 * 2)


def format_bytes(num: float) -> str:
    """'3.2 GiB'-style text."""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _no_fit_error(tables, options, unplaced, assignments, searcher: Searcher, planner) -> PlannerError:
    """Force the unplaced tables in at their smallest-memory option to measure each rank's shortfall."""
    topo = planner.topology
    state = searcher.new_state()
    for a in assignments.values():
        state.apply(a)
    names = [tables[t].label for t in unplaced]
    primary = "HBM" if topo.uses_hbm else "DDR"
    for t in unplaced:
        def footprint(o: ShardingOption) -> float:
            return float(np.max(o.hbm_bytes if topo.uses_hbm else o.ddr_bytes))
        for option in options[t]:
            searcher.ensure_costs(option)
        smallest = min(options[t], key=footprint)
        used = state.hbm if topo.uses_hbm else state.ddr
        if smallest.kind == "fixed":
            state.apply(Assignment(smallest, (0,)))
        elif smallest.kind == "rank":
            locations = []
            for _ in range(smallest.num_groups):
                location = int(np.argmin(used))
                state.apply(Assignment(smallest, (location,)))
                locations.append(location)
        else:
            host = int(np.argmin(used.reshape(topo.num_hosts, -1).sum(axis=1)))
            for _ in range(smallest.num_groups):
                state.apply(Assignment(smallest, (host,)))
    used, cap = (state.hbm, state.hbm_cap) if topo.uses_hbm else (state.ddr, state.ddr_cap)
    over = {r: float(used[r] - cap[r]) for r in range(topo.world_size) if used[r] > cap[r]}
    total_need = float(used.sum())
    per_rank_cap = float(cap.max()) if len(cap) else 0.0
    suggestions = []
    if per_rank_cap > 0:
        ranks_needed = int(np.ceil(total_need / per_rank_cap))
        if ranks_needed > topo.world_size:
            suggestions.append(f"use at least {ranks_needed} ranks (now {topo.world_size})")
    if planner.optimizer != EmbOptimType.SGD:
        suggestions.append(f"a lower-memory optimizer (row_wise_adagrad or sgd instead of {planner.optimizer.value})")
    for t in unplaced:
        c = tables[t].constraints
        if c is not None and c.sharding_types is not None and "row_wise" not in c.sharding_types:
            suggestions.append(f"allow row_wise for {tables[t].label}")
        if topo.uses_hbm and (c is None or c.compute_kernels is None or "fused_uvm_caching" not in c.compute_kernels):
            if c is not None and c.compute_kernels is not None:
                suggestions.append(f"allow fused_uvm_caching for {tables[t].label} (weights in host memory)")
    if not over:
        suggestions.append("relax the constraints: the tables fit in total but not with the allowed placements")
    suggestions.append(f"more {primary} per rank ({'hbm_cap' if topo.uses_hbm else 'ddr_cap'})")
    shortfall = "; ".join(f"rank {r} is {format_bytes(b)} ({b:.0f} bytes) over its {format_bytes(cap[r])} {primary}"
                          for r, b in sorted(over.items()))
    message = (f"tables {', '.join(names)} do not fit"
               + (f": {shortfall}" if shortfall else "")
               + ". To make it fit: " + "; or ".join(suggestions))
    kind = PlannerErrorType.INSUFFICIENT_STORAGE if over else PlannerErrorType.PARTITION
    return PlannerError(message, kind, names, over, suggestions)
