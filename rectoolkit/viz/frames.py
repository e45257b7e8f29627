"""Plain objects -> the DataFrames the figures draw (no figure code here).

Every figure in `rectoolkit.viz` takes a DataFrame or a dict of arrays. When the planner's report is not at
hand, these helpers compute the same tables from a `ShardingPlan` and the table configs alone.

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.plan.types import ParameterSharding, ShardMetadata
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> plan = {"t": ParameterSharding("row_wise", ranks=[0, 1], shards=[
    ...     ShardMetadata.on_rank(0, 0, 0, 5, 4), ShardMetadata.on_rank(1, 5, 0, 5, 4)])}
    >>> placement_frame(plan, [t])[["table", "rank", "row_start", "row_end", "bytes"]].values.tolist()
    [['t', 0, 0, 5, 80], ['t', 1, 5, 10, 80]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from rectoolkit.modules.configs import DATA_TYPE_NUM_BITS, BaseEmbeddingConfig
from rectoolkit.plan.types import ParameterSharding, ShardingPlan
from rectoolkit.viz.style import format_bytes

PlanLike = Union[ShardingPlan, Mapping[str, ParameterSharding]]
TablesLike = Union[None, Sequence[BaseEmbeddingConfig], Mapping[str, BaseEmbeddingConfig]]

PLACEMENT_COLUMNS = [
    "table", "shard", "rank", "sharding_type", "compute_kernel", "row_start", "row_end", "col_start",
    "col_end", "rows", "columns", "bytes", "num_embeddings", "embedding_dim",
]


def table_shardings(plan: PlanLike) -> Dict[str, ParameterSharding]:
    """Table name -> ParameterSharding from a ShardingPlan (all module paths) or a plain dict.

    Tables of nested modules keep their own names; a name used by two modules gets its path as prefix.
    """
    if isinstance(plan, ShardingPlan):
        entries = list(plan.items())
    elif hasattr(plan, "plan") and isinstance(getattr(plan, "plan"), Mapping):  # TorchRec-like plan
        entries = [(path, name, ps) for path, tables in plan.plan.items() for name, ps in tables.items()]
    else:
        entries = [("", name, ps) for name, ps in dict(plan).items()]
    counts: Dict[str, int] = {}
    for _, name, _ in entries:
        counts[name] = counts.get(name, 0) + 1
    return {(name if counts[name] == 1 or not path else f"{path}.{name}"): ps for path, name, ps in entries}


def table_configs(tables: TablesLike) -> Dict[str, BaseEmbeddingConfig]:
    """Table name -> config, from a list or dict of EmbeddingBagConfig / EmbeddingConfig (or None)."""
    if tables is None:
        return {}
    if isinstance(tables, Mapping):
        return dict(tables)
    return {table.name: table for table in tables}


def bytes_per_element(table: Optional[BaseEmbeddingConfig]) -> float:
    """Weight bytes per element of a table (4 for FP32; 0.5 for INT4)."""
    if table is None:
        return 4.0
    return DATA_TYPE_NUM_BITS[table.data_type] / 8


def placement_frame(plan: PlanLike, tables: TablesLike = None) -> pd.DataFrame:
    """One row per shard: table, shard index, rank, type, kernel, row/column range, size and weight bytes.

    Without table configs, a table's size is taken from its shards and elements count 4 bytes.
    """
    configs = table_configs(tables)
    records = []
    for name, ps in table_shardings(plan).items():
        config = configs.get(name)
        element_bytes = bytes_per_element(config)
        num_rows = config.num_embeddings if config else max((s.rows[1] for s in ps.shards), default=0)
        dim = config.embedding_dim if config else max((s.columns[1] for s in ps.shards), default=0)
        for index, shard in enumerate(ps.shards):
            rows, cols = shard.shard_sizes
            records.append((
                name, index, shard.rank, ps.sharding_type, ps.compute_kernel, shard.rows[0], shard.rows[1],
                shard.columns[0], shard.columns[1], rows, cols, int(rows * cols * element_bytes), num_rows, dim,
            ))
    return pd.DataFrame.from_records(records, columns=PLACEMENT_COLUMNS)


def rank_table_bytes(placement: pd.DataFrame, world_size: Optional[int] = None) -> pd.DataFrame:
    """Bytes of each table on each rank: a [rank x table] DataFrame (tables in plan order), zeros filled."""
    if world_size is None:
        world_size = int(placement["rank"].max()) + 1 if len(placement) else 0
    codes, table_order = pd.factorize(placement["table"])  # tables in plan order
    grid = np.zeros((world_size, len(table_order)), dtype=np.int64)
    ranks = placement["rank"].to_numpy(dtype=np.int64)
    keep = ranks < world_size
    np.add.at(grid, (ranks[keep], codes[keep]), placement["bytes"].to_numpy(dtype=np.int64)[keep])
    return pd.DataFrame(grid, index=pd.RangeIndex(world_size, name="rank"), columns=list(table_order))


def weights_per_rank(placement: pd.DataFrame, world_size: int) -> np.ndarray:
    """Weight bytes held by each rank (every replica counted on its rank)."""
    totals = np.zeros(world_size, dtype=np.int64)
    np.add.at(totals, placement["rank"].to_numpy(dtype=np.int64), placement["bytes"].to_numpy(dtype=np.int64))
    return totals


def total_matrix(matrices: Mapping[str, np.ndarray]) -> np.ndarray:
    """Sum of the rank x rank byte matrices of every collective."""
    arrays = [np.asarray(m, dtype=np.float64) for m in matrices.values()]
    if not arrays:
        raise ValueError("total_matrix: no collectives given")
    return np.sum(arrays, axis=0)


def off_diagonal_bytes(matrix: np.ndarray) -> float:
    """Bytes that really cross a link (the diagonal stays on its rank)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    return float(matrix.sum() - np.trace(matrix))


# ----------------------------------------------------------------------------------------------- plan diff


@dataclass
class PlanDiff:
    """What changed between two plans.

    `tables`: one row per table (status same / moved / resharded / added / removed, old and new type and ranks,
    bytes that must move). `ranks`: per rank, weight bytes before, after and the delta.
    """

    tables: pd.DataFrame
    ranks: pd.DataFrame

    @property
    def changed(self) -> pd.DataFrame:
        return self.tables[self.tables["status"] != "same"]

    @property
    def moved_bytes(self) -> int:
        return int(self.tables["moved_bytes"].sum())

    def summary(self) -> str:
        """One line for people: how many tables changed, and the weights that move (in binary units)."""
        counts = self.tables["status"].value_counts()
        parts = [f"{counts.get(s, 0)} {s}" for s in ("moved", "resharded", "added", "removed") if counts.get(s, 0)]
        if not parts:
            return "the plans are identical"
        return ", ".join(parts) + f"; {format_bytes(self.moved_bytes)} of weights change rank"


def plan_diff(old: PlanLike, new: PlanLike, tables: TablesLike = None) -> PlanDiff:
    """Compare two plans table by table and rank by rank.

    A table is "moved" when its sharding type is unchanged but shards changed rank or extent, "resharded"
    when the type changed. `moved_bytes` counts the weight bytes of the new plan that are not already on the
    same rank in the old plan (exact overlap of shard rectangles).

        >>> from rectoolkit.plan.types import ParameterSharding, ShardMetadata
        >>> a = {"t": ParameterSharding("table_wise", ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, 10, 4)])}
        >>> b = {"t": ParameterSharding("table_wise", ranks=[1], shards=[ShardMetadata.on_rank(1, 0, 0, 10, 4)])}
        >>> d = plan_diff(a, b)
        >>> d.tables[["table", "status", "moved_bytes"]].values.tolist(), d.ranks["delta_bytes"].tolist()
        ([['t', 'moved', 160]], [-160, 160])
        >>> d.summary()
        '1 moved; 160 B of weights change rank'
    """
    configs = table_configs(tables)
    old_tables, new_tables = table_shardings(old), table_shardings(new)
    old_place, new_place = placement_frame(old, tables), placement_frame(new, tables)
    world_size = 1 + int(max(old_place["rank"].max() if len(old_place) else 0,
                             new_place["rank"].max() if len(new_place) else 0))
    records = []
    for name in list(old_tables) + [n for n in new_tables if n not in old_tables]:
        before, after = old_tables.get(name), new_tables.get(name)
        element_bytes = bytes_per_element(configs.get(name))
        if before is None:
            status, moved = "added", _area(after.shards) * element_bytes
        elif after is None:
            status, moved = "removed", 0
        else:
            moved = (_area(after.shards) - _overlap_on_same_rank(before.shards, after.shards)) * element_bytes
            if before.sharding_type != after.sharding_type:
                status = "resharded"
            elif _shard_key(before) != _shard_key(after) or before.compute_kernel != after.compute_kernel:
                status = "moved"
            else:
                status = "same"
        records.append({
            "table": name,
            "status": status,
            "old_type": before.sharding_type if before else None,
            "new_type": after.sharding_type if after else None,
            "old_ranks": _ranks_of(before),
            "new_ranks": _ranks_of(after),
            "moved_bytes": int(moved),
        })
    table_frame = pd.DataFrame.from_records(
        records, columns=["table", "status", "old_type", "new_type", "old_ranks", "new_ranks", "moved_bytes"])
    before_bytes = weights_per_rank(old_place, world_size)
    after_bytes = weights_per_rank(new_place, world_size)
    rank_frame = pd.DataFrame({
        "rank": np.arange(world_size),
        "old_bytes": before_bytes,
        "new_bytes": after_bytes,
        "delta_bytes": after_bytes - before_bytes,
    })
    return PlanDiff(tables=table_frame, ranks=rank_frame)


def _ranks_of(ps: Optional[ParameterSharding]) -> Optional[List[int]]:
    if ps is None:
        return None
    return sorted({shard.rank for shard in ps.shards})


def _shard_key(ps: ParameterSharding) -> List[Tuple]:
    return sorted((s.rank, tuple(s.shard_offsets), tuple(s.shard_sizes)) for s in ps.shards)


def _area(shards: Iterable) -> int:
    return sum(s.shard_sizes[0] * s.shard_sizes[1] for s in shards)


def _overlap_on_same_rank(old_shards: Sequence, new_shards: Sequence) -> int:
    """Elements of the new shards already held by the same rank in the old shards."""
    total = 0
    for new in new_shards:
        for old in old_shards:
            if old.rank != new.rank:
                continue
            rows = min(old.rows[1], new.rows[1]) - max(old.rows[0], new.rows[0])
            cols = min(old.columns[1], new.columns[1]) - max(old.columns[0], new.columns[0])
            if rows > 0 and cols > 0:
                total += rows * cols
    return total
