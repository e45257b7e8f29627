"""Is this plan usable for these tables on this many ranks? The one check every entry point calls.

A plan enters rectoolkit in several ways: a file (`load_plan`), TorchRec's plan (`from_torchrec`), an object built
in code and given to `DistributedModelParallel` or to `shard_embedding_bag_collection`, a hand edit
(`move_shard`). Each calls `validate_plan` (or `validate_module_plan` for one collection) before anything runs, so a
plan that would compute silently wrong results is refused with the table, the shard and the fix:

- every table of the model is planned, and the plan names no table (or module) the model lacks;
- each table's shards tile it exactly: every cell in exactly one shard (no overlap, no gap), inside the table;
  DATA_PARALLEL: one full replica per rank;
- every shard sits on a rank in 0..world_size-1, and `ranks` lists exactly the ranks of the shards.

    >>> from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
    >>> overlapping = ParameterSharding("row_wise", shards=[ShardMetadata.on_rank(0, 0, 0, 5, 4),
    ...                                                     ShardMetadata.on_rank(1, 0, 0, 5, 4)])
    >>> validate_plan(ShardingPlan({"": {"t": overlapping}}), {"t": (10, 4)}, world_size=2)
    Traceback (most recent call last):
    ...
    rectoolkit.plan.validation.PlanValidationError: plan: the shards of table t do not tile it exactly: overlap at rows 0..5 in columns 0..4 (shards: rows (0, 5) cols (0, 4) on rank 0, rows (0, 5) cols (0, 4) on rank 1)
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from rectoolkit.modules.table_sources import find_table_configs
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardingType


class PlanValidationError(ValueError):
    """A plan file or plan that cannot be used: names the file / table / shard and what is wrong."""


def validate_plan(plan: ShardingPlan, tables: Any = None, world_size: Optional[int] = None, source: str = "plan") -> None:
    """Raise PlanValidationError unless every table's shards tile it exactly (DATA_PARALLEL: one full replica
    per rank), ranks are within world_size, and (with `tables`: shapes, configs, a DataFrame or a model) the
    plan covers exactly those tables."""
    shapes = _shapes(tables) if tables is not None else None
    if shapes is not None:
        _check_same_tables(plan, shapes, source)
    for path, name, ps in plan.items():
        label = _label((path, name))
        _check_ranks(label, ps, world_size, source)
        if shapes is not None:
            rows, cols = shapes[(path, name)]
        elif ps.shards:
            rows = max(s.rows[1] for s in ps.shards)
            cols = max(s.columns[1] for s in ps.shards)
        else:
            raise PlanValidationError(f"{source}: table {label} has no shards")
        check_tiling(label, ps, rows, cols, source)
        _check_listed_ranks(label, ps, source)


def validate_module_plan(module_plan: Mapping[str, ParameterSharding], tables: Sequence[Any], world_size: int,
                         owner: str) -> None:
    """validate_plan for the plan of one collection (table name -> ParameterSharding) and its configs."""
    validate_plan(ShardingPlan({"": dict(module_plan)}), {t.name: (t.num_embeddings, t.embedding_dim) for t in tables},
                  world_size, source=f"the plan of {owner}")


def _check_same_tables(plan: ShardingPlan, shapes: Mapping[Tuple[str, str], Tuple[int, int]], source: str) -> None:
    """The plan names exactly the model's tables; a whole module missing or unknown is said as such."""
    planned = {(path, name) for path, name, _ in plan.items()}
    if planned == set(shapes):
        return
    model_paths = sorted({path for path, _ in shapes})
    missing_paths = [p for p in model_paths if p not in plan.plan]
    unknown_paths = [p for p in plan.plan if p not in model_paths]
    problems = []
    for path in missing_paths:
        hint = (f" (a plan made from the bare tables is keyed by module path ''. Plan the whole model instead: "
                f"planner.plan(model) keys it by {path!r}; or pass {{{path!r}: plan.plan['']}})"
                if "" in unknown_paths and path != "" else "")
        problems.append(f"no entry for the collection at {path!r}; it has modules {sorted(plan.plan)}{hint}")
    if unknown_paths and not missing_paths:
        problems.append(f"it names module(s) {unknown_paths} where the model has no embedding collection "
                        f"(collections at {model_paths})")
    known = [k for k in set(shapes) if k[0] not in missing_paths]
    missing = sorted(_label(k) for k in set(known) - planned)
    unknown = sorted(_label(k) for k in planned - set(shapes) if k[0] not in unknown_paths)
    if missing:
        problems.append(f"no entry for {missing}")
    if unknown:
        problems.append(f"unknown tables {unknown} (not in the model: remove them from the plan, or check the names)")
    raise PlanValidationError(f"{source} is a plan for other tables: " + "; ".join(problems)
                              + f" (the model has tables {sorted(_label(k) for k in shapes)})")


def _check_ranks(label: str, ps: ParameterSharding, world_size: Optional[int], source: str) -> None:
    for index, shard in enumerate(ps.shards):
        if shard.placement is None:
            raise PlanValidationError(f"{source}: table {label}: shard {index} (offsets {shard.shard_offsets}, sizes "
                                      f"{shard.shard_sizes}) has no placement; give it placement='rank:<r>/<device>'")
        if shard.rank < 0 or (world_size is not None and shard.rank >= world_size):
            raise PlanValidationError(f"{source}: table {label}: shard {index} is placed on rank {shard.rank} but the "
                                      f"world size is {world_size}; re-plan for {world_size} ranks"
                                      if world_size is not None else
                                      f"{source}: table {label}: shard {index} is placed on rank {shard.rank}")


def _check_listed_ranks(label: str, ps: ParameterSharding, source: str) -> None:
    if ps.ranks is not None and set(ps.ranks) != {s.rank for s in ps.shards}:
        raise PlanValidationError(f"{source}: table {label} lists ranks {ps.ranks} but its shards are on ranks "
                                  f"{sorted({s.rank for s in ps.shards})}; make `ranks` the ranks of the shards "
                                  "(or leave it None)")


def check_tiling(label: str, ps: ParameterSharding, rows: int, cols: int, source: str = "plan") -> None:
    """Shards must cover [0, rows) x [0, cols) exactly once (replicas: each the full table, one per rank)."""
    if not ps.shards:
        raise PlanValidationError(f"{source}: table {label} ({ps.sharding_type}) has no shards")
    if ps.sharding_type == ShardingType.DATA_PARALLEL.value:
        for s in ps.shards:
            if s.shard_offsets != [0, 0] or s.shard_sizes != [rows, cols]:
                raise PlanValidationError(f"{source}: data_parallel table {label} has replica {s.shard_offsets}+"
                                          f"{s.shard_sizes} on rank {s.rank}; each replica must be [0, 0]+[{rows}, {cols}]")
        ranks = [s.rank for s in ps.shards]
        if len(set(ranks)) != len(ranks):
            raise PlanValidationError(f"{source}: data_parallel table {label} has two replicas on one rank ({ranks})")
        return
    for s in ps.shards:
        if s.rows[1] > rows or s.columns[1] > cols:
            raise PlanValidationError(
                f"{source}: table {label} is {rows} x {cols} but a shard on rank {s.rank} covers rows {s.rows}, "
                f"columns {s.columns}: the shards do not tile the table exactly")
    # cut the columns at every shard edge; in each strip the shards spanning it must chain rows 0..rows
    cuts = sorted({0, cols} | {s.columns[0] for s in ps.shards} | {s.columns[1] for s in ps.shards})
    for start, end in zip(cuts, cuts[1:]):
        spanning = sorted((s for s in ps.shards if s.num_elements and s.columns[0] <= start and s.columns[1] >= end),
                          key=lambda s: s.rows)
        covered = 0
        for shard in spanning:
            lo, hi = shard.rows
            if lo != covered:
                what = "overlap" if lo < covered else "gap"
                listing = ", ".join(f"rows {s.rows} cols {s.columns} on rank {s.rank}" for s in spanning)
                raise PlanValidationError(
                    f"{source}: the shards of table {label} do not tile it exactly: {what} at rows "
                    f"{min(lo, covered)}..{max(lo, covered)} in columns {start}..{end} (shards: {listing})")
            covered = hi
        if covered != rows:
            raise PlanValidationError(
                f"{source}: the shards of table {label} do not tile it exactly: rows {covered}..{rows} of columns "
                f"{start}..{end} are in no shard")


def _label(key: Tuple[str, str]) -> str:
    path, name = key
    return f"{path}.{name}" if path else name


def _shapes(tables: Any) -> Dict[Tuple[str, str], Tuple[int, int]]:
    """(module path, table) -> (rows, cols) from a dict of shapes, PlannerTables, configs, a DataFrame or a module."""
    if isinstance(tables, Mapping):
        return {(k if isinstance(k, tuple) else ("", k)): tuple(v) for k, v in tables.items()}
    if isinstance(tables, Sequence) and tables and hasattr(tables[0], "module_path") and hasattr(tables[0], "config"):
        return {t.key: (t.rows, t.dim) for t in tables}
    return {(path, c.name): (c.num_embeddings, c.embedding_dim) for path, c, _, _ in find_table_configs(tables)}
