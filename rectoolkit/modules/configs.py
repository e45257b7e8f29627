"""Embedding table configs with TorchRec's names and fields.

    >>> cfg = EmbeddingBagConfig(name="t_user", num_embeddings=100, embedding_dim=8, feature_names=["user"])
    >>> cfg.pooling, cfg.num_features()
    (<PoolingType.SUM: 'SUM'>, 1)
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, List, Optional

import torch


@enum.unique
class PoolingType(enum.Enum):
    """How the rows of one bag are combined: summed, averaged, or kept (sequence embeddings)."""

    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"


@enum.unique
class DataType(enum.Enum):
    """Storage type of an embedding table's weights (TorchRec's names and values)."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT64 = "INT64"
    INT32 = "INT32"
    INT8 = "INT8"
    UINT8 = "UINT8"
    INT4 = "INT4"
    INT2 = "INT2"

    def __str__(self) -> str:  # as TorchRec's: f"{DataType.FP16}" is "FP16"
        return self.value


DATA_TYPE_NUM_BITS = {
    DataType.FP32: 32,
    DataType.FP16: 16,
    DataType.BF16: 16,
    DataType.INT64: 64,
    DataType.INT32: 32,
    DataType.INT8: 8,
    DataType.UINT8: 8,
    DataType.INT4: 4,
    DataType.INT2: 2,
}

_TORCH_DTYPES = {
    DataType.FP32: torch.float32,
    DataType.FP16: torch.float16,
    DataType.BF16: torch.bfloat16,
    DataType.INT64: torch.int64,
    DataType.INT32: torch.int32,
    DataType.INT8: torch.int8,
    DataType.UINT8: torch.uint8,
}


_PACKED_DTYPES = {DataType.INT4: torch.quint4x2, DataType.INT2: torch.quint2x4}  # TorchRec's names for them


def data_type_to_dtype(data_type: DataType) -> torch.dtype:
    """The torch dtype of `data_type`, as TorchRec's (INT4 / INT2: torch's packed quint4x2 / quint2x4).

        >>> data_type_to_dtype(DataType.FP16), data_type_to_dtype(DataType.INT4)
        (torch.float16, torch.quint4x2)
    """
    return _TORCH_DTYPES.get(data_type) or _PACKED_DTYPES[data_type]


def dtype_to_data_type(dtype: torch.dtype) -> DataType:
    """The DataType of a torch dtype, as TorchRec's (torch's quantized int8 types are INT8); raises ValueError for
    dtypes tables cannot use."""
    if dtype in (torch.qint8, torch.quint8):
        return DataType.INT8
    for data_type, candidate in {**_TORCH_DTYPES, **_PACKED_DTYPES}.items():
        if candidate == dtype:
            return data_type
    raise ValueError(f"no embedding DataType for torch dtype {dtype}; use one of "
                     f"{list(_TORCH_DTYPES.values()) + list(_PACKED_DTYPES.values())}")


def pooling_type_to_str(pooling_type: PoolingType) -> str:
    """"sum" or "mean" (TorchRec's; NONE pooling has no name there: ValueError)."""
    if pooling_type not in (PoolingType.SUM, PoolingType.MEAN):
        raise ValueError(f"Unsupported pooling type {pooling_type}")
    return pooling_type.value.lower()


class ShardingType(enum.Enum):
    """TorchRec's torchrec.modules.embedding_configs.ShardingType: its own enum of the well-known sharding types
    (TorchRec 1.8's members, no GRID_SHARD; a different class from torchrec.distributed.types.ShardingType)."""

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"


def _fbgemm_enums(function: str):
    from rectoolkit.fbgemm_probe import fbgemm_imports

    if fbgemm_imports():
        try:
            from fbgemm_gpu.split_embedding_configs import SparseType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

            return PoolingMode, SparseType
        except ImportError:
            pass
    raise ImportError(f"rectoolkit.modules.embedding_configs.{function} returns fbgemm-gpu's enum, as TorchRec's; "
                      "fbgemm-gpu (fbgemm_gpu) does not import here: install it (fbgemm-gpu or fbgemm-gpu-cpu)")


def pooling_type_to_pooling_mode(pooling_type: PoolingType, sharding_type: Optional[Any] = None) -> Any:
    """TorchRec's: fbgemm's PoolingMode of a PoolingType; MEAN under (TABLE_)ROW_WISE sharding is SUM (the mean is
    applied after the kernel). `sharding_type` is any ShardingType enum (compared by value). Needs fbgemm-gpu."""
    PoolingMode, _ = _fbgemm_enums("pooling_type_to_pooling_mode")
    if pooling_type.value == PoolingType.SUM.value:
        return PoolingMode.SUM
    if pooling_type.value == PoolingType.MEAN.value:
        if sharding_type is not None and sharding_type.value in (ShardingType.TABLE_ROW_WISE.value,
                                                                 ShardingType.ROW_WISE.value):
            return PoolingMode.SUM
        return PoolingMode.MEAN
    if pooling_type.value == PoolingType.NONE.value:
        return PoolingMode.NONE
    raise Exception(f"Invalid pooling type {pooling_type}")


def data_type_to_sparse_type(data_type: DataType) -> Any:
    """TorchRec's: fbgemm's SparseType of a DataType (INT8 and UINT8 both INT8); ValueError for the others.
    Needs fbgemm-gpu."""
    _, SparseType = _fbgemm_enums("data_type_to_sparse_type")
    by_value = {"FP32": SparseType.FP32, "FP16": SparseType.FP16, "BF16": SparseType.BF16, "INT8": SparseType.INT8,
                "UINT8": SparseType.INT8, "INT4": SparseType.INT4, "INT2": SparseType.INT2}
    name = getattr(data_type, "name", None)
    if isinstance(data_type, enum.Enum) and name in by_value and data_type.value == name:
        return by_value[name]
    raise ValueError(f"Invalid DataType {data_type}")


_TORCHREC_ONLY_FIELDS = {"input_dim": None, "total_num_buckets": None, "use_virtual_table": False,
                         "virtual_table_eviction_policy": None, "enable_embedding_update": False, "stash_weights": False}


@dataclass
class BaseEmbeddingConfig:
    """Fields shared by bag (pooled) and sequence tables, named as in TorchRec."""

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: List[str] = field(default_factory=list)
    weight_init_max: Optional[float] = None
    weight_init_min: Optional[float] = None
    num_embeddings_post_pruning: Optional[int] = None
    init_fn: Optional[Callable[[torch.Tensor], Optional[torch.Tensor]]] = None
    need_pos: bool = False
    # TorchRec's fields for its SSD/DRAM virtual tables and bucketized ids: at their defaults only (refused otherwise)
    input_dim: Optional[int] = None
    total_num_buckets: Optional[int] = None
    use_virtual_table: bool = False
    virtual_table_eviction_policy: Optional[Any] = None
    enable_embedding_update: bool = False
    stash_weights: bool = False

    def __post_init__(self) -> None:
        where = f"table {self.name!r}" if self.name else "embedding config"
        for name, default in _TORCHREC_ONLY_FIELDS.items():
            if getattr(self, name) != default:
                raise ValueError(f"{where}: {name}={getattr(self, name)!r} is not supported: rectoolkit has no virtual "
                                 f"(SSD/DRAM, bucketized) tables, which TorchRec's field sets up; leave it at {default!r}")
        if not isinstance(self.num_embeddings, int) or self.num_embeddings <= 0:
            raise ValueError(f"{where}: num_embeddings must be a positive int, got {self.num_embeddings!r}")
        if not isinstance(self.embedding_dim, int) or self.embedding_dim <= 0:
            raise ValueError(f"{where}: embedding_dim must be a positive int, got {self.embedding_dim!r}")
        if isinstance(self.feature_names, str):
            raise ValueError(f"{where}: feature_names must be a list of names, got the string {self.feature_names!r}")
        self.feature_names = list(self.feature_names)
        if len(set(self.feature_names)) != len(self.feature_names):
            raise ValueError(f"{where}: feature_names has duplicates: {self.feature_names}")
        if isinstance(self.data_type, str):
            self.data_type = DataType(self.data_type.upper())
        if self.init_fn is None:
            self.init_fn = partial(
                torch.nn.init.uniform_, a=self.get_weight_init_min(), b=self.get_weight_init_max()
            )

    def get_weight_init_max(self) -> float:
        return math.sqrt(1 / self.num_embeddings) if self.weight_init_max is None else self.weight_init_max

    def get_weight_init_min(self) -> float:
        return -math.sqrt(1 / self.num_embeddings) if self.weight_init_min is None else self.weight_init_min

    def num_features(self) -> int:
        return len(self.feature_names)


@dataclass
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """A table whose rows are pooled per bag (SUM or MEAN), as used by EmbeddingBagCollection."""

    pooling: PoolingType = PoolingType.SUM

    def __post_init__(self) -> None:
        if isinstance(self.pooling, str):
            self.pooling = PoolingType(self.pooling.upper())
        super().__post_init__()


@dataclass
class EmbeddingTableConfig(BaseEmbeddingConfig):
    """TorchRec's config of a table inside its sharded modules (a base config plus how it is read); rectoolkit's
    sharded modules keep the collection's own configs, so this is for code that builds one itself."""

    pooling: PoolingType = PoolingType.SUM
    is_weighted: bool = False
    has_feature_processor: bool = False
    embedding_names: List[str] = field(default_factory=list)


@dataclass
class EmbeddingConfig(BaseEmbeddingConfig):
    """A table looked up one row per id (sequence embeddings), as used by EmbeddingCollection."""
