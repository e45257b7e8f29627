"""Bring your own tables: a list of configs, a Workload, a DataFrame or CSV, or a model -> one TableSet.

    >>> import pandas as pd
    >>> frame = pd.DataFrame({"name": ["user", "item"], "num_embeddings": [1000, 50], "embedding_dim": [16, 8],
    ...                       "pooling_factor": [1.0, 20.0]})
    >>> table_set = as_table_set(frame)
    >>> [(t.name, t.num_embeddings, t.feature_names) for t in table_set.tables], table_set.pooling_factors
    ([('user', 1000, ['user']), ('item', 50, ['item'])], {'user': 1.0, 'item': 20.0})
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import pandas as pd

from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.planner.tables import read_table_frame


@dataclass
class TableSet:
    """Tables to plan, with the workload statistics the planner needs (pooling factor per feature)."""

    tables: List[BaseEmbeddingConfig]
    pooling_factors: Dict[str, float] = field(default_factory=dict)
    batch_size: Optional[int] = None
    source: str = ""
    module: Any = None  # the model the tables came from: plans then carry its module paths

    @property
    def planner_input(self) -> Any:
        """What to hand to the planner: the model (so plans use its module paths) or the table list."""
        return self.module if self.module is not None else self.tables

    def __post_init__(self) -> None:
        names = [t.name for t in self.tables]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"table names must be unique; {duplicates} appear more than once")
        if not self.tables:
            raise ValueError("no tables to plan: give at least one EmbeddingBagConfig (or a row of a DataFrame)")


def tables_from_frame(frame: pd.DataFrame) -> TableSet:
    """Rows of a DataFrame -> configs (+ pooling factors); the columns the planner reads
    (`rectoolkit.planner.tables.read_table_frame`): name, num_embeddings (or rows), embedding_dim (or dim),
    optional feature_names, pooling_factor, data_type, pooling ("NONE" for a sequence table)."""
    tables, pooling_factors = [], {}
    for _, table, factor, _ in read_table_frame(frame):
        tables.append(table)
        if factor is not None:
            pooling_factors.update({feature: factor for feature in table.feature_names})
    return TableSet(tables, pooling_factors, source="DataFrame")


def tables_from_module(module: Any) -> TableSet:
    """Every table of every embedding collection inside an nn.Module (ours or TorchRec's)."""
    tables: List[BaseEmbeddingConfig] = []
    for submodule in module.modules():
        if hasattr(submodule, "embedding_bag_configs"):
            tables.extend(submodule.embedding_bag_configs())
        elif hasattr(submodule, "embedding_configs"):
            tables.extend(submodule.embedding_configs())
    if not tables:
        raise ValueError(f"{type(module).__name__} holds no EmbeddingBagCollection or EmbeddingCollection; "
                         "pass the tables (a list of EmbeddingBagConfig) instead")
    converted = [t if isinstance(t, BaseEmbeddingConfig) else _from_torchrec_config(t) for t in tables]
    ours = all(isinstance(t, BaseEmbeddingConfig) for t in tables)
    return TableSet(converted, source=type(module).__name__, module=module if ours else None)


def _from_torchrec_config(config: Any) -> BaseEmbeddingConfig:
    kind = EmbeddingBagConfig if hasattr(config, "pooling") else EmbeddingConfig
    extra = {"pooling": PoolingType(config.pooling.value)} if kind is EmbeddingBagConfig else {}
    return kind(name=config.name, num_embeddings=config.num_embeddings, embedding_dim=config.embedding_dim,
                feature_names=list(config.feature_names), data_type=DataType(config.data_type.value), **extra)


def as_table_set(source: Any) -> TableSet:
    """Accept configs, a Workload or workload name, a DataFrame, a .csv / .json path, or an nn.Module."""
    if isinstance(source, TableSet):
        return source
    if isinstance(source, pd.DataFrame):
        return tables_from_frame(source)
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix.lower() == ".csv":
            if not path.exists():
                raise FileNotFoundError(f"table CSV {path} does not exist")
            table_set = tables_from_frame(pd.read_csv(path))
            table_set.source = str(path)
            return table_set
        from rectoolkit.workloads import load_workload

        source = load_workload(source)
    if hasattr(source, "tables") and hasattr(source, "pooling_factors"):  # a Workload
        return TableSet(list(source.tables), dict(source.pooling_factors),
                        getattr(source, "batch_size_per_rank", None), source=getattr(source, "name", "workload"))
    if hasattr(source, "modules") and callable(source.modules):  # an nn.Module
        return tables_from_module(source)
    if isinstance(source, BaseEmbeddingConfig):
        return TableSet([source], source="config")
    try:
        items = list(source)
    except TypeError:
        raise TypeError(f"cannot read tables from a {type(source).__name__}; pass a list of EmbeddingBagConfig, "
                        "a Workload, a DataFrame, a CSV path or an nn.Module") from None
    if not all(isinstance(t, BaseEmbeddingConfig) for t in items):
        bad = next(t for t in items if not isinstance(t, BaseEmbeddingConfig))
        raise TypeError(f"expected EmbeddingBagConfig items, got a {type(bad).__name__}: {bad!r}")
    return TableSet(items, source="configs")
