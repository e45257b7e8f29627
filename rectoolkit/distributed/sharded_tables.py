"""TorchRec's descriptions of tables inside its sharded modules (torchrec.distributed.embedding_types): a table's
local shard (`ShardedConfig`, `ShardedMetaConfig`), its kernel (`EmbeddingAttributes`), both with the table's config
(`ShardedEmbeddingTable`), and a group of tables one kernel looks up together (`GroupedEmbeddingConfig`).

rectoolkit's sharded collections keep the collections' own configs and plan (rectoolkit.distributed.sharded_ebc), so
these are for code written against TorchRec's types: with the same fields and the same methods.

    >>> table = ShardedEmbeddingTable(num_embeddings=10, embedding_dim=8, name="t", feature_names=["a", "b"],
    ...                               local_rows=10, local_cols=4)
    >>> group = GroupedEmbeddingConfig(DataType.FP32, PoolingType.SUM, False, False, EmbeddingComputeKernel.FUSED,
    ...                                [table])
    >>> group.dim_sum(), group.feature_names(), group.embedding_dims()
    (8, ['a', 'b'], [4, 4])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from rectoolkit.modules.configs import DataType, EmbeddingTableConfig, PoolingType
from rectoolkit.plan.types import EmbeddingComputeKernel, ShardMetadata

__all__ = ["DTensorMetadata", "EmbeddingAttributes", "GroupedEmbeddingConfig", "ShardedConfig", "ShardedEmbeddingTable",
           "ShardedMetaConfig"]


@dataclass
class ShardedConfig:
    """The rows and columns of a table this rank holds."""

    local_rows: int = 0
    local_cols: int = 0


@dataclass
class DTensorMetadata:
    """How a shard would be laid out as a DTensor (device mesh, placements, global size and stride); carried only."""

    mesh: Optional[Any] = None
    placements: Optional[Tuple[Any, ...]] = None
    size: Optional[Tuple[int, ...]] = None
    stride: Optional[Tuple[int, ...]] = None


@dataclass
class ShardedMetaConfig(ShardedConfig):
    """ShardedConfig with this rank's ShardMetadata and the whole table's metadata (torch's ShardedTensorMetadata,
    carried only)."""

    local_metadata: Optional[ShardMetadata] = None
    global_metadata: Optional[Any] = None
    dtensor_metadata: Optional[DTensorMetadata] = None


@dataclass
class EmbeddingAttributes:
    """The compute kernel a table is looked up with."""

    compute_kernel: EmbeddingComputeKernel = EmbeddingComputeKernel.DENSE


@dataclass
class ShardedEmbeddingTable(ShardedMetaConfig, EmbeddingAttributes, EmbeddingTableConfig):
    """A table's config (EmbeddingTableConfig's fields first), its kernel, this rank's part of it and the fused
    params its kernel gets; TorchRec's field order."""

    fused_params: Optional[Dict[str, Any]] = None


@dataclass
class GroupedEmbeddingConfig:
    """Tables of one data type, pooling, weighting and kernel, looked up by one kernel; the per-feature lists below
    run over the tables in order, each table's features in order."""

    data_type: DataType
    pooling: PoolingType
    is_weighted: bool
    has_feature_processor: bool
    compute_kernel: EmbeddingComputeKernel
    embedding_tables: List[ShardedEmbeddingTable]
    fused_params: Optional[Dict[str, Any]] = None
    enable_embedding_update: bool = False

    def feature_hash_sizes(self) -> List[int]:
        """Each feature's table row count."""
        return [table.num_embeddings for table in self.embedding_tables for _ in range(table.num_features())]

    def num_features(self) -> int:
        return sum(table.num_features() for table in self.embedding_tables)

    def dim_sum(self) -> int:
        """The width of the pooled output: each feature's local columns, summed."""
        return sum(table.num_features() * table.local_cols for table in self.embedding_tables)

    def table_names(self) -> List[str]:
        return [table.name for table in self.embedding_tables]

    def feature_names(self) -> List[str]:
        return [name for table in self.embedding_tables for name in table.feature_names]

    def embedding_dims(self) -> List[int]:
        """Each feature's local columns."""
        return [table.local_cols for table in self.embedding_tables for _ in range(table.num_features())]

    def embedding_names(self) -> List[str]:
        return [name for table in self.embedding_tables for name in table.embedding_names]

    def embedding_shard_metadata(self) -> List[Optional[ShardMetadata]]:
        """Each feature's table's local ShardMetadata."""
        return [table.local_metadata for table in self.embedding_tables for _ in table.feature_names]

    def is_using_virtual_table(self) -> bool:
        return any(table.use_virtual_table for table in self.embedding_tables)
