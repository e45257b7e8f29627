"""Which tables an input describes: a list of configs, a pandas DataFrame of tables, or a model.

The planner (rectoolkit.planner.tables), plan validation (rectoolkit.plan.serialization) and the widgets read
their inputs here, so they accept the same things.

    >>> import rectoolkit as rtk
    >>> [(path, c.name) for path, c, _, _ in find_table_configs(
    ...     [rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2, feature_names=["f"])])]
    [('', 't')]
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from rectoolkit.modules.mc_embedding_modules import BaseManagedCollisionEmbeddingCollection
from rectoolkit.modules.mc_modules import ManagedCollisionCollection

# modules that hold an embedding collection and add to it (position weights, managed collisions) -> the attribute
# that holds the collection. TorchRec plans and shards such a module as a whole, by its own path and sharder.
WRAPPED_COLLECTION_ATTRIBUTE = {
    FeatureProcessedEmbeddingBagCollection: "_embedding_bag_collection",
    BaseManagedCollisionEmbeddingCollection: "_embedding_module",
}

def find_table_configs(source: Any) -> List[Tuple[str, BaseEmbeddingConfig, Optional[float], bool]]:
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


def wrapped_collections(module: Any) -> Dict[str, Tuple[str, str]]:
    """The collections of `module` that sit inside a wrapper (WRAPPED_COLLECTION_ATTRIBUTE): the collection's path
    -> (the wrapper's path, the wrapper's class name).

        >>> import rectoolkit as rtk, torch
        >>> from rectoolkit.modules.feature_processor_ import PositionWeightedModuleCollection
        >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
        ...                                   feature_names=["f"])], is_weighted=True)
        >>> model = torch.nn.Sequential(FeatureProcessedEmbeddingBagCollection(ebc,
        ...                                 PositionWeightedModuleCollection({"f": 3})))
        >>> wrapped_collections(model)
        {'0._embedding_bag_collection': ('0', 'FeatureProcessedEmbeddingBagCollection')}
    """
    found = {}
    for path, sub in getattr(module, "named_modules", lambda: [])():
        for wrapper, attribute in WRAPPED_COLLECTION_ATTRIBUTE.items():
            if isinstance(sub, wrapper):
                found[f"{path}.{attribute}" if path else attribute] = (path, type(sub).__name__)
    return found


def _from_module(module: Any) -> List[Tuple[str, BaseEmbeddingConfig, Optional[float], bool]]:
    found = []
    for path, sub in module.named_modules():
        getter = getattr(sub, "embedding_bag_configs", None) or getattr(sub, "embedding_configs", None)
        if getter is None or not callable(getter) or isinstance(sub, ManagedCollisionCollection):
            continue  # a managed-collision collection lists the configs of the collection it sits in front of
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


