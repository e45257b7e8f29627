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
from typing import Any, Dict, Optional, Tuple, Union

from rectoolkit.plan.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.plan.validation import PlanValidationError, _shapes, check_tiling, validate_plan  # noqa: F401 (re-exported)

PLAN_FORMAT = "rectoolkit.sharding_plan"
SCHEMA_VERSION = 1


# TorchRec's per-table options kept in the JSON: booleans as they are, enums by name ("FATAL", "FP32"); the
# cache settings other than the load factor are TorchRec objects and stay out of the file
JSON_OPTIONS = ("enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")


def _carried_options(ps: ParameterSharding) -> Dict[str, Any]:
    names = {}
    for option in JSON_OPTIONS:
        value = getattr(ps, option)
        names[option] = getattr(value, "name", value)
    return names


def plan_to_dict(plan: ShardingPlan, tables: Any = None) -> Dict[str, Any]:
    """A JSON-ready dict: format, schema_version, the plan, and (if given) each table's shape for validation."""
    out: Dict[str, Any] = {"format": PLAN_FORMAT, "schema_version": SCHEMA_VERSION, "plan": {}}
    for path, name, ps in plan.items():
        out["plan"].setdefault(path, {})[name] = {
            "sharding_type": ps.sharding_type,
            "compute_kernel": ps.compute_kernel,
            "ranks": ps.ranks,
            "cache_load_factor": ps.cache_load_factor,
            **{name: value for name, value in _carried_options(ps).items() if value is not None},
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
                                                 shards=shards, cache_load_factor=entry.get("cache_load_factor"),
                                                 **{option: entry.get(option) for option in JSON_OPTIONS})
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


def _split_key(key: str) -> Tuple[str, str]:
    path, _, name = key.rpartition("/")
    return path, name
