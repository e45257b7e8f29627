"""Per-table constraints for the planner, with TorchRec's `ParameterConstraints` fields.

    >>> c = ParameterConstraints(sharding_types=["row_wise", ShardingType.TABLE_WISE], pooling_factors=[4.0])
    >>> [t.value for t in c.allowed_sharding_types()]
    ['row_wise', 'table_wise']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Union

from rectoolkit.plan.types import CacheParams, EmbeddingComputeKernel, ShardingType

__all__ = ["CacheParams", "ParameterConstraints", "check_per_feature"]

# fbgemm's BoundsCheckMode values that mean "raise on an id out of range": what rectoolkit's id check does
RAISING_BOUNDS_CHECK_MODES = {"FATAL", "V2_FATAL"}


POOLING_FACTOR = 1.0  # TorchRec's default mean ids per sample (torchrec.distributed.planner.constants)


class DefaultPoolingFactors(list):
    """TorchRec's default `pooling_factors`, [1.0], marked as not given: the planner then takes a table's pooling
    factors from its workload stats or DataFrame (1.0 per feature without them), one per feature."""


@dataclass
class ParameterConstraints:
    """What the planner may do with one table, and what it should assume about its features.

    Args:
        sharding_types: allowed types (ShardingType members or TorchRec's strings); None = all.
        compute_kernels: allowed kernels ("fused", "fused_uvm", "fused_uvm_caching", "dense"); None = default.
        min_partition: smallest column block for COLUMN_WISE / GRID_SHARD (TorchRec's meaning).
        pooling_factors: mean ids per sample, one per feature of the table. Default TorchRec's [1.0]; left at it,
            the planner reads them from its stats or DataFrame, else 1.0 for every feature.
        num_poolings: poolings per sample, one per feature: only 1.0 (rectoolkit's collections pool each feature
            once per sample); other values are refused.
        batch_sizes: samples per rank, one per feature (default: the topology's batch_size). When the features of
            one collection get different sizes, the planner prices the batch a collection then takes, one batch size
            per feature (VBE, rectoolkit.plan.traffic), padded to the largest.
        is_weighted: per-id weights travel with the ids (4 more bytes each).
        cache_params / cache_load_factor: fraction of rows cached in HBM for fused_uvm_caching; cache_params
            (rectoolkit.plan.types.CacheParams or TorchRec's) is carried whole into the plan's ParameterSharding.
        enforce_hbm, stochastic_rounding, bounds_check_mode, output_dtype: carried into the plan's
            ParameterSharding, as TorchRec's planner does. Refused here when rectoolkit cannot honour them:
            bounds_check_mode other than FATAL / V2_FATAL (rectoolkit raises on an out-of-range id; for other
            handling build the collection with ids_out_of_range="hash"), output_dtype other than FP32 (sharded
            collections output fp32). stochastic_rounding is checked when the table is sharded (FP16 tables).
        key_value_params, use_virtual_table: SSD / virtual tables are not implemented; only None / False.
        feature_names: the table's feature names, checked against the table (TorchRec carries them as a label).
        device_group: "cpu" / "cuda": must be the topology's compute_device (rectoolkit plans one device group;
            TorchRec's planner skips the tables of other groups).
        ranks: restrict the table's shards to these ranks (TABLE_WISE / COLUMN_WISE blocks).
    """

    sharding_types: Optional[List[Union[str, ShardingType]]] = None
    compute_kernels: Optional[List[Union[str, EmbeddingComputeKernel]]] = None
    min_partition: Optional[int] = None
    pooling_factors: List[float] = field(default_factory=lambda: DefaultPoolingFactors([POOLING_FACTOR]))
    num_poolings: Optional[List[float]] = None
    batch_sizes: Optional[List[int]] = None
    is_weighted: bool = False
    cache_params: Optional[Any] = None
    enforce_hbm: Optional[bool] = None
    stochastic_rounding: Optional[bool] = None
    bounds_check_mode: Optional[Any] = None
    feature_names: Optional[List[str]] = None
    output_dtype: Optional[Any] = None
    device_group: Optional[str] = None
    key_value_params: Optional[Any] = None
    use_virtual_table: bool = False
    # rectoolkit's own, after TorchRec's fields so that TorchRec's positional calls mean the same here
    cache_load_factor: Optional[float] = None
    ranks: Optional[List[int]] = None

    def __post_init__(self) -> None:
        if self.sharding_types is not None:
            if isinstance(self.sharding_types, (str, ShardingType)):
                self.sharding_types = [self.sharding_types]
            self.sharding_types = [ShardingType.parse(t).value for t in self.sharding_types]
        if self.compute_kernels is not None:
            if isinstance(self.compute_kernels, (str, EmbeddingComputeKernel)):
                self.compute_kernels = [self.compute_kernels]
            self.compute_kernels = [EmbeddingComputeKernel.parse(k).value for k in self.compute_kernels]
        if not isinstance(self.pooling_factors, DefaultPoolingFactors):
            self.pooling_factors = [float(p) for p in (self.pooling_factors or [])]
        if any(p < 0 for p in self.pooling_factors):
            raise ValueError(f"ParameterConstraints: pooling_factors must be >= 0, got {self.pooling_factors}")
        if self.batch_sizes is not None:
            self.batch_sizes = [int(b) for b in self.batch_sizes]
            if any(b <= 0 for b in self.batch_sizes):
                raise ValueError(f"ParameterConstraints: batch_sizes must be positive, got {self.batch_sizes}")
        if self.min_partition is not None and int(self.min_partition) <= 0:
            raise ValueError(f"ParameterConstraints: min_partition must be positive, got {self.min_partition}")
        self._refuse_what_cannot_be_honoured()
        if self.cache_load_factor is None and self.cache_params is not None:
            self.cache_load_factor = getattr(self.cache_params, "load_factor", None)
        if self.cache_load_factor is not None and not 0 < float(self.cache_load_factor) <= 1:
            raise ValueError(f"ParameterConstraints: cache_load_factor must be in (0, 1], got {self.cache_load_factor}")

    def _refuse_what_cannot_be_honoured(self) -> None:
        if self.num_poolings is not None and any(float(n) != 1.0 for n in self.num_poolings):
            raise NotImplementedError(f"ParameterConstraints(num_poolings={self.num_poolings}): rectoolkit's collections "
                                      "pool each feature once per sample; leave num_poolings None (or 1.0 per feature)")
        if self.output_dtype is not None and _name_of(self.output_dtype) != "FP32":
            raise NotImplementedError(f"ParameterConstraints(output_dtype={self.output_dtype}): rectoolkit's sharded "
                                      "collections output fp32; leave output_dtype None or DataType.FP32, and cast "
                                      "the pooled output yourself")
        if self.bounds_check_mode is not None and _name_of(self.bounds_check_mode) not in RAISING_BOUNDS_CHECK_MODES:
            raise NotImplementedError(f"ParameterConstraints(bounds_check_mode={self.bounds_check_mode}): rectoolkit "
                                      "always checks ids and raises on one out of range (BoundsCheckMode.FATAL); to map "
                                      "them into range build the collection with ids_out_of_range='hash'")
        if self.key_value_params is not None or self.use_virtual_table:
            raise NotImplementedError("ParameterConstraints(key_value_params=..., use_virtual_table=True): SSD and "
                                      "virtual tables are not implemented in rectoolkit; leave them None / False")

    def given_pooling_factors(self) -> List[float]:
        """The pooling factors the caller gave ([] when left at TorchRec's default)."""
        return [] if isinstance(self.pooling_factors, DefaultPoolingFactors) else list(self.pooling_factors)

    def __hash__(self) -> int:  # TorchRec's ParameterConstraints is hashable (by its fields)
        return hash(tuple(_hashable(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def allowed_sharding_types(self) -> Optional[List[ShardingType]]:
        return None if self.sharding_types is None else [ShardingType(t) for t in self.sharding_types]

    def allowed_compute_kernels(self) -> Optional[List[EmbeddingComputeKernel]]:
        return None if self.compute_kernels is None else [EmbeddingComputeKernel(k) for k in self.compute_kernels]

    def describe(self) -> str:
        """The restricting fields, for error messages."""
        parts = []
        if self.sharding_types is not None:
            parts.append(f"sharding_types={self.sharding_types}")
        if self.compute_kernels is not None:
            parts.append(f"compute_kernels={self.compute_kernels}")
        if self.min_partition is not None:
            parts.append(f"min_partition={self.min_partition}")
        if self.ranks is not None:
            parts.append(f"ranks={self.ranks}")
        return ", ".join(parts) or "no restrictions"


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    try:
        hash(value)
    except TypeError:  # a mutable dataclass (cache_params): by its fields, as printed
        return repr(value)
    return value


def _name_of(value: Any) -> str:
    """An enum member's name (ours, TorchRec's or fbgemm's), or the string given: DataType.FP32 -> "FP32"."""
    return str(getattr(value, "name", value)).upper()


def check_per_feature(name: str, values: Optional[Sequence], num_features: int, table: str) -> None:
    if values and len(values) != num_features:
        raise ValueError(
            f"ParameterConstraints for table {table!r}: {name} has {len(values)} entries but the table has "
            f"{num_features} features; give one per feature"
        )
