"""The planner's view of its input: every table with its module path, features, pooling factors and batch.

Accepts a list of configs, a pandas DataFrame, or an nn.Module holding collections (any submodule with
TorchRec's `embedding_bag_configs()` or `embedding_configs()` method).

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> [(x.module_path, x.name, x.pooling_factors) for x in collect_tables([t], batch_size=8)]
    [('', 't', [1.0])]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from rectoolkit.modules.configs import (
    DATA_TYPE_NUM_BITS,
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)
from rectoolkit.plan.types import ShardingType
from rectoolkit.planner.constraints import ParameterConstraints, check_per_feature
from rectoolkit.planner.stats import WorkloadStats


@dataclass
class PlannerTable:
    """One table as the planner sees it. `key` = (module path, table name) is unique."""

    module_path: str
    config: BaseEmbeddingConfig
    pooling_factors: List[float]  # mean ids per sample, one per feature
    batch_sizes: List[int]  # samples per rank, one per feature
    is_weighted: bool
    constraints: Optional[ParameterConstraints] = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def key(self) -> Tuple[str, str]:
        return self.module_path, self.config.name

    @property
    def label(self) -> str:
        return f"{self.module_path}.{self.name}" if self.module_path else self.name

    # set in __post_init__ (plain attributes: the search reads them often)
    rows: int = field(init=False)
    dim: int = field(init=False)
    pooled: bool = field(init=False)

    @property
    def element_bytes(self) -> float:
        return DATA_TYPE_NUM_BITS[self.config.data_type] / 8

    def __post_init__(self) -> None:
        self.rows, self.dim = self.config.num_embeddings, self.config.embedding_dim
        self.pooled = isinstance(self.config, EmbeddingBagConfig) and self.config.pooling != PoolingType.NONE

    @property
    def weight_bytes(self) -> float:
        return self.rows * self.dim * self.element_bytes


def collect_tables(
    source: Any,
    batch_size: int,
    constraints: Optional[Mapping[str, ParameterConstraints]] = None,
    stats: Optional[WorkloadStats] = None,
) -> List[PlannerTable]:
    """Normalize configs / DataFrame / module into PlannerTables, applying constraints and stats.

    Pooling factor precedence: constraints.pooling_factors > stats > the DataFrame's pooling_factor > 1.0.
    """
    constraints = dict(constraints or {})
    found = _find_configs(source)
    tables: List[PlannerTable] = []
    seen = set()
    for module_path, config, pooling_factor, weighted in found:
        if (module_path, config.name) in seen:
            raise ValueError(f"planner input: table {config.name!r} appears twice in module {module_path!r}")
        seen.add((module_path, config.name))
        c = constraints.get(config.name) or constraints.get(f"{module_path}.{config.name}")
        num_features = len(config.feature_names)
        if num_features == 0:
            raise ValueError(f"planner input: table {config.name!r} has no feature_names; give it at least one")
        if c is not None:
            check_per_feature("pooling_factors", c.pooling_factors, num_features, config.name)
            check_per_feature("batch_sizes", c.batch_sizes, num_features, config.name)
            check_per_feature("num_poolings", c.num_poolings, num_features, config.name)
        factors = []
        for index, feature in enumerate(config.feature_names):
            if c is not None and c.pooling_factors:
                factors.append(c.pooling_factors[index])
            elif stats is not None and feature in stats.pooling_factors:
                factors.append(float(stats.pooling_factors[feature]))
            elif pooling_factor is not None:
                factors.append(float(pooling_factor))
            else:
                factors.append(1.0)
        default_batch = stats.batch_size if stats is not None and stats.batch_size else batch_size
        batches = list(c.batch_sizes) if c is not None and c.batch_sizes else [int(default_batch)] * num_features
        is_weighted = bool(weighted or (c is not None and c.is_weighted) or (stats is not None and stats.is_weighted))
        tables.append(PlannerTable(module_path, config, factors, batches, is_weighted, c))
    if not tables:
        raise ValueError("planner input has no embedding tables: pass configs, a DataFrame or a module with collections")
    unknown = set(constraints) - {t.name for t in tables} - {f"{t.module_path}.{t.name}" for t in tables}
    if unknown:
        raise ValueError(f"constraints name tables that are not in the input: {sorted(unknown)}")
    return tables


def _find_configs(source: Any) -> List[Tuple[str, BaseEmbeddingConfig, Optional[float], bool]]:
    """(module path, config, pooling factor from the input or None, is_weighted) for every table."""
    if _is_dataframe(source):
        return read_table_frame(source)
    if hasattr(source, "named_modules"):
        return _from_module(source)
    if isinstance(source, BaseEmbeddingConfig):
        source = [source]
    if isinstance(source, Sequence) and all(isinstance(c, BaseEmbeddingConfig) for c in source):
        return [("", config, None, False) for config in source]
    raise TypeError(
        f"planner input of type {type(source).__name__} is not supported: pass a list of EmbeddingBagConfig, "
        "a pandas DataFrame (name, num_embeddings, embedding_dim, feature_names, pooling) or an nn.Module"
    )


def _from_module(module: Any) -> List[Tuple[str, BaseEmbeddingConfig, Optional[float], bool]]:
    found = []
    for path, sub in module.named_modules():
        getter = getattr(sub, "embedding_bag_configs", None) or getattr(sub, "embedding_configs", None)
        if getter is None or not callable(getter):
            continue
        weighted = bool(getattr(sub, "is_weighted", lambda: False)()) if callable(getattr(sub, "is_weighted", None)) else False
        found += [(path, config, None, weighted) for config in getter()]
    if not found:
        raise ValueError(
            f"module {type(module).__name__} holds no embedding collection (no submodule with "
            "embedding_bag_configs() or embedding_configs())"
        )
    return found


def _is_dataframe(source: Any) -> bool:
    return type(source).__name__ == "DataFrame" and hasattr(source, "iterrows")


# Accepted DataFrame column names (first match wins).
NAME_COLUMNS = ("name", "table", "table_name")
ROWS_COLUMNS = ("num_embeddings", "rows", "num_rows", "hash_size")
DIM_COLUMNS = ("embedding_dim", "dim", "columns", "dimension")


def read_table_frame(frame: Any) -> List[Tuple[str, BaseEmbeddingConfig, Optional[float], bool]]:
    """(module path, config, pooling factor or None, is_weighted) for every row of a DataFrame of tables.

    Columns: name (or table), num_embeddings (or rows, hash_size), embedding_dim (or dim); optional
    feature_names (a list or a comma-separated string; default: the table name), pooling ("SUM", "MEAN",
    or "NONE" for a sequence table), pooling_factor, data_type ("FP16"), is_weighted, module_path.
    """
    name_col = _pick(frame.columns, NAME_COLUMNS, "table name")
    rows_col = _pick(frame.columns, ROWS_COLUMNS, "row count")
    dim_col = _pick(frame.columns, DIM_COLUMNS, "embedding dim")
    found = []
    for index, row in frame.reset_index(drop=True).iterrows():
        name = str(row[name_col])
        features = row["feature_names"] if "feature_names" in frame.columns else None
        if features is None or (isinstance(features, float) and features != features):
            features = [name]
        elif isinstance(features, str):
            features = [f.strip() for f in features.replace(";", ",").split(",") if f.strip()]
        try:
            rows, dim = int(row[rows_col]), int(row[dim_col])
        except (TypeError, ValueError) as error:
            raise ValueError(f"tables DataFrame row {index} (table {name!r}): {rows_col}={row[rows_col]!r} and "
                             f"{dim_col}={row[dim_col]!r} must be whole numbers") from error
        pooling = str(row["pooling"]).upper() if _given(frame, row, "pooling") else "SUM"
        common = dict(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=list(features))
        if _given(frame, row, "data_type"):
            common["data_type"] = DataType(str(row["data_type"]).upper())
        config = EmbeddingConfig(**common) if pooling == "NONE" else EmbeddingBagConfig(pooling=PoolingType(pooling), **common)
        factor = float(row["pooling_factor"]) if _given(frame, row, "pooling_factor") else None
        weighted = bool(row["is_weighted"]) if _given(frame, row, "is_weighted") else False
        module_path = str(row["module_path"]) if _given(frame, row, "module_path") else ""
        found.append((module_path, config, factor, weighted))
    return found


def _pick(columns: Sequence[str], candidates: Sequence[str], what: str) -> str:
    for name in candidates:
        if name in columns:
            return name
    raise ValueError(f"the tables DataFrame needs a column for the {what} (one of {list(candidates)}); it has {list(columns)}")


def _given(frame: Any, row: Any, column: str) -> bool:
    """The row has a value (not NaN / None) in this optional column."""
    if column not in frame.columns:
        return False
    value = row[column]
    return value is not None and value == value


def tables_by_module(tables: Sequence[PlannerTable]) -> Dict[str, List[PlannerTable]]:
    out: Dict[str, List[PlannerTable]] = {}
    for table in tables:
        out.setdefault(table.module_path, []).append(table)
    return out


def apply_sharders(tables: List[PlannerTable], sharders: Sequence[Any], compute_device: str) -> List[PlannerTable]:
    """Restrict each table to the sharding types its collection's sharder supports (TorchRec's planner does the
    same). A sharder is matched by its `module_type`'s class name, so TorchRec's sharders work too: passing
    TorchRec's EmbeddingBagCollectionSharder on CPU gives a plan TorchRec can run there.

    The table's own constraints still apply (the intersection); a table whose collection has no sharder in the
    list is an error, since nothing would shard it.
    """
    by_module = {getattr(getattr(s, "module_type", None), "__name__", None): s for s in sharders}
    out = []
    for table in tables:
        module = "EmbeddingBagCollection" if isinstance(table.config, EmbeddingBagConfig) else "EmbeddingCollection"
        sharder = by_module.get(module)
        if sharder is None:
            raise ValueError(f"planner: no sharder for table {table.label!r} (an {module}); pass one whose module_type "
                             f"is {module} (rectoolkit.distributed.sharders), or sharders=None to shard every table")
        known = {t.value for t in ShardingType}  # TorchRec's list may name types rectoolkit has not got
        allowed = [ShardingType(t) for t in sharder.sharding_types(compute_device) if t in known]
        c = table.constraints
        if c is not None and c.sharding_types is not None:
            wanted = c.allowed_sharding_types()
            allowed = [t for t in wanted if t in allowed]
            if not allowed:
                raise ValueError(f"planner: table {table.label!r} allows sharding types {[t.value for t in wanted]}, "
                                 f"but {type(sharder).__name__} supports only "
                                 f"{sharder.sharding_types(compute_device)} on {compute_device}")
        merged = dataclasses.replace(c, sharding_types=allowed) if c is not None \
            else ParameterConstraints(sharding_types=allowed)
        out.append(dataclasses.replace(table, constraints=merged))
    return out
