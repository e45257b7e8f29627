"""Sharding plans as JSON, with a schema version and validation.

    >>> from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
    >>> plan = ShardingPlan({"": {"t": ParameterSharding("table_wise", "fused", [0],
    ...                            [ShardMetadata([0, 0], [10, 4], "rank:0/cpu")])}})
    >>> plan_from_json(plan_to_json(plan)).plan[""]["t"].ranks
    [0]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

from rectoolkit.modules.table_sources import find_table_configs
from rectoolkit.plan.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan, ShardingType, ShardMetadata

PLAN_FORMAT = "rectoolkit.sharding_plan"
SCHEMA_VERSION = 1


class PlanValidationError(ValueError):
    """A plan file or plan that cannot be used: names the file / table / shard and what is wrong."""


def plan_to_dict(plan: ShardingPlan, tables: Any = None) -> Dict[str, Any]:
    """A JSON-ready dict: format, schema_version, the plan, and (if given) each table's shape for validation."""
    out: Dict[str, Any] = {"format": PLAN_FORMAT, "schema_version": SCHEMA_VERSION, "plan": {}}
    for path, name, ps in plan.items():
        out["plan"].setdefault(path, {})[name] = {
            "sharding_type": ps.sharding_type,
            "compute_kernel": ps.compute_kernel,
            "ranks": ps.ranks,
            "cache_load_factor": ps.cache_load_factor,
            "shards": [{"shard_offsets": s.shard_offsets, "shard_sizes": s.shard_sizes, "placement": s.placement}
                       for s in ps.shards],
        }
    if tables is not None:
        out["tables"] = {f"{path}/{name}" if path else name: list(shape) for (path, name), shape in _shapes(tables).items()}
    return out


def plan_from_dict(data: Any, tables: Any = None, source: str = "plan") -> ShardingPlan:
    """Rebuild and validate a plan. With `tables`, also check that it is a plan for exactly those tables."""
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlanValidationError(
            f"{source} is not a rectoolkit sharding plan (expected a JSON object with \"format\": \"{PLAN_FORMAT}\")")
    version = data.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise PlanValidationError(
            f"{source} has schema_version {version!r}; this rectoolkit reads versions 1..{SCHEMA_VERSION} (upgrade rectoolkit)")
    if not isinstance(data.get("plan"), dict):
        raise PlanValidationError(f"{source}: 'plan' must map module paths to tables")
    modules: Dict[str, EmbeddingModuleShardingPlan] = {}
    for path, entries in data["plan"].items():
        module = EmbeddingModuleShardingPlan()
        for name, entry in entries.items():
            where = f"{source}: table {name!r}" + (f" in module {path!r}" if path else "")
            try:
                shards = [ShardMetadata(s["shard_offsets"], s["shard_sizes"], s["placement"]) for s in entry["shards"]]
                module[name] = ParameterSharding(entry["sharding_type"], entry["compute_kernel"], entry.get("ranks"),
                                                 shards, entry.get("cache_load_factor"))
            except (KeyError, TypeError, ValueError) as error:
                raise PlanValidationError(f"{where}: malformed entry ({error})") from error
        modules[path] = module
    plan = ShardingPlan(modules)
    stored = data.get("tables")
    if tables is None and stored is not None:
        tables = {_split_key(key): tuple(shape) for key, shape in stored.items()}
    if tables is not None:
        validate_plan(plan, tables, source=source)
    else:
        validate_plan(plan, None, source=source)
    return plan


def plan_to_json(plan: ShardingPlan, tables: Any = None, indent: Optional[int] = 1) -> str:
    return json.dumps(plan_to_dict(plan, tables), indent=indent)


def plan_from_json(text: str, tables: Any = None, source: str = "plan") -> ShardingPlan:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise PlanValidationError(f"{source} is not a rectoolkit sharding plan: not valid JSON ({error})") from error
    return plan_from_dict(data, tables, source)


def save_plan(plan: ShardingPlan, path: Union[str, Path], tables: Any = None) -> Path:
    """Write a plan as JSON (with the tables' shapes when given, so loading can check them)."""
    path = Path(path)
    if tables is not None:
        validate_plan(plan, tables, source="plan to save")
    path.write_text(plan_to_json(plan, tables))
    return path


def load_plan(path: Union[str, Path], tables: Any = None) -> ShardingPlan:
    """Read a plan saved by save_plan; with `tables`, check it is a plan for exactly those tables."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"plan file {path} does not exist")
    return plan_from_json(path.read_text(), tables, source=f"file {path}")


def validate_plan(plan: ShardingPlan, tables: Any = None, world_size: Optional[int] = None, source: str = "plan") -> None:
    """Raise PlanValidationError unless every table's shards tile it exactly (DATA_PARALLEL: one full replica
    per rank), ranks are within world_size, and (with `tables`) the plan covers exactly those tables."""
    shapes = _shapes(tables) if tables is not None else None
    if shapes is not None:
        planned = {(path, name) for path, name, _ in plan.items()}
        missing = sorted(_label(k) for k in set(shapes) - planned)
        extra = sorted(_label(k) for k in planned - set(shapes))
        if missing or extra:
            raise PlanValidationError(
                f"{source} is a plan for other tables: "
                + (f"no entry for {missing}" if missing else "")
                + ("; " if missing and extra else "")
                + (f"unknown tables {extra}" if extra else "")
                + f" (the model has {sorted(_label(k) for k in shapes)})")
    for path, name, ps in plan.items():
        label = _label((path, name))
        for shard in ps.shards:
            if world_size is not None and shard.rank >= world_size:
                raise PlanValidationError(f"{source}: table {label} has a shard on rank {shard.rank}, "
                                          f"but world_size is {world_size}")
        if shapes is not None:
            rows, cols = shapes[(path, name)]
        elif ps.shards:
            rows = max(s.rows[1] for s in ps.shards)
            cols = max(s.columns[1] for s in ps.shards)
        else:
            raise PlanValidationError(f"{source}: table {label} has no shards")
        check_tiling(label, ps, rows, cols, source)


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
    cuts = sorted({0, cols} | {s.columns[0] for s in ps.shards} | {s.columns[1] for s in ps.shards})
    for start, end in zip(cuts, cuts[1:]):
        spans = sorted(s.rows for s in ps.shards if s.num_elements and s.columns[0] <= start and s.columns[1] >= end)
        covered = 0
        for lo, hi in spans:
            if lo != covered:
                what = "overlap" if lo < covered else "gap"
                raise PlanValidationError(
                    f"{source}: the shards of table {label} do not tile it exactly: {what} at rows "
                    f"{min(lo, covered)}..{max(lo, covered)} in columns {start}..{end}")
            covered = hi
        if covered != rows:
            raise PlanValidationError(
                f"{source}: the shards of table {label} do not tile it exactly: rows {covered}..{rows} of columns "
                f"{start}..{end} are in no shard")


def _label(key: Tuple[str, str]) -> str:
    path, name = key
    return f"{path}.{name}" if path else name


def _split_key(key: str) -> Tuple[str, str]:
    path, _, name = key.rpartition("/")
    return path, name


def _shapes(tables: Any) -> Dict[Tuple[str, str], Tuple[int, int]]:
    """(module path, table) -> (rows, cols) from a dict of shapes, PlannerTables, configs, a DataFrame or a module."""
    if isinstance(tables, Mapping):
        return {(k if isinstance(k, tuple) else ("", k)): tuple(v) for k, v in tables.items()}
    if isinstance(tables, Sequence) and tables and hasattr(tables[0], "module_path") and hasattr(tables[0], "config"):
        return {t.key: (t.rows, t.dim) for t in tables}
    return {(path, c.name): (c.num_embeddings, c.embedding_dim) for path, c, _, _ in find_table_configs(tables)}
