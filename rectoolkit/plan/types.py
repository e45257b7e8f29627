"""Plan types: how each table is cut into shards and which rank holds each shard.

Plain dataclasses with TorchRec's names, so `plan.plan[""]["user_table"].sharding_type` reads the same.

    >>> shard = ShardMetadata(shard_offsets=[0, 0], shard_sizes=[100, 8], placement="rank:1/cpu")
    >>> shard.rank
    1
    >>> ps = ParameterSharding(ShardingType.TABLE_WISE, "fused", ranks=[1], shards=[shard])
    >>> ps.sharding_type
    'table_wise'
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union


@enum.unique
class ShardingType(enum.Enum):
    """How a table is split across ranks (TorchRec's names and string values)."""

    DATA_PARALLEL = "data_parallel"  # a full replica on every rank
    TABLE_WISE = "table_wise"  # the whole table on one rank
    COLUMN_WISE = "column_wise"  # column blocks, each placed like a table
    ROW_WISE = "row_wise"  # row blocks over all ranks
    TABLE_ROW_WISE = "table_row_wise"  # row blocks over the ranks of one host
    TABLE_COLUMN_WISE = "table_column_wise"  # column blocks over the ranks of one host
    GRID_SHARD = "grid_shard"  # column blocks, each row-wise over the ranks of one host

    @classmethod
    def parse(cls, value: Union["ShardingType", str]) -> "ShardingType":
        """Accept a member, TorchRec's string ("row_wise") or the member name ("ROW_WISE")."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in cls._value2member_map_:  # the common case, on hot paths
            return cls._value2member_map_[value]
        if hasattr(value, "value") and isinstance(value.value, str):  # TorchRec's own enum member
            value = value.value
        text = str(value).strip().lower()
        for member in cls:
            if text in (member.value, member.name.lower()):
                return member
        raise ValueError(f"unknown sharding type {value!r}; use one of {[m.value for m in cls]}")


@enum.unique
class EmbeddingComputeKernel(enum.Enum):
    """Where a shard's weights live and how it is looked up (TorchRec's names)."""

    DENSE = "dense"  # plain autograd, dense gradients
    FUSED = "fused"  # batched kernel, optimizer fused into backward, weights in HBM (or host RAM on CPU)
    FUSED_UVM = "fused_uvm"  # weights in host memory, read over the host link
    FUSED_UVM_CACHING = "fused_uvm_caching"  # host memory with an HBM cache of the hottest rows
    QUANT = "quant"  # quantized weights for inference
    QUANT_UVM = "quant_uvm"
    QUANT_UVM_CACHING = "quant_uvm_caching"

    @classmethod
    def parse(cls, value: Union["EmbeddingComputeKernel", str]) -> "EmbeddingComputeKernel":
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in cls._value2member_map_:
            return cls._value2member_map_[value]
        if hasattr(value, "value") and isinstance(value.value, str):
            value = value.value
        text = str(value).strip().lower()
        for member in cls:
            if text in (member.value, member.name.lower()):
                return member
        raise ValueError(f"unknown compute kernel {value!r}; use one of {[m.value for m in cls]}")


# The kernels the planner proposes per device (a plan may also ask for "dense": plain weights).
CUDA_KERNELS = (EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.FUSED_UVM_CACHING, EmbeddingComputeKernel.FUSED_UVM)
CPU_KERNELS = (EmbeddingComputeKernel.FUSED,)
QUANT_KERNELS = (EmbeddingComputeKernel.QUANT, EmbeddingComputeKernel.QUANT_UVM, EmbeddingComputeKernel.QUANT_UVM_CACHING)


@dataclass(frozen=True)
class ShardMetadata:
    """One shard: its offsets and sizes in (rows, columns) of the table, and where it lives.

    `placement` reads like TorchRec's: "rank:<rank>/<device>".
    """

    shard_offsets: List[int]
    shard_sizes: List[int]
    placement: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_offsets", [int(x) for x in self.shard_offsets])
        object.__setattr__(self, "shard_sizes", [int(x) for x in self.shard_sizes])
        if len(self.shard_offsets) != 2 or len(self.shard_sizes) != 2:
            raise ValueError(
                f"ShardMetadata: offsets {self.shard_offsets} and sizes {self.shard_sizes} must be [rows, columns]"
            )
        if min(self.shard_offsets) < 0 or min(self.shard_sizes) < 0:
            raise ValueError(f"ShardMetadata: negative offset or size in {self.shard_offsets} / {self.shard_sizes}")
        if not str(self.placement).startswith("rank:"):
            raise ValueError(f"ShardMetadata: placement {self.placement!r} must look like 'rank:0/cpu'")
        object.__setattr__(self, "placement", str(self.placement))

    @classmethod
    def on_rank(cls, rank: int, row_offset: int, col_offset: int, rows: int, cols: int,
                device: str = "cpu") -> "ShardMetadata":
        """Shortcut: a rows x cols shard at (row_offset, col_offset) placed on `rank`."""
        device_name = f"{device}:{rank}" if device == "cuda" else device
        return cls([row_offset, col_offset], [rows, cols], f"rank:{rank}/{device_name}")

    @property
    def rank(self) -> int:
        return int(self.placement.split("/")[0].split(":")[1])

    @property
    def device(self) -> str:
        parts = self.placement.split("/", 1)
        return parts[1] if len(parts) > 1 else "cpu"

    @property
    def rows(self) -> Tuple[int, int]:
        """[start, end) of the table rows in this shard."""
        return self.shard_offsets[0], self.shard_offsets[0] + self.shard_sizes[0]

    @property
    def columns(self) -> Tuple[int, int]:
        """[start, end) of the table columns in this shard."""
        return self.shard_offsets[1], self.shard_offsets[1] + self.shard_sizes[1]

    @property
    def num_elements(self) -> int:
        return self.shard_sizes[0] * self.shard_sizes[1]


class CacheAlgorithm(enum.Enum):
    """fbgemm's cache eviction policies (torchrec.distributed.types.CacheAlgorithm), same names and values."""

    LRU = 0
    LFU = 1


class BoundsCheckMode(enum.IntEnum):
    """fbgemm's handling of ids out of a table's range (torchrec.distributed.types.BoundsCheckMode), same names
    and values. rectoolkit's id check is FATAL: it raises, naming the feature, table and id."""

    FATAL = 0
    WARNING = 1
    IGNORE = 2
    NONE = 3
    V2_IGNORE = 4
    V2_WARNING = 5
    V2_FATAL = 6


@dataclass
class CacheParams:
    """TorchRec's caching settings of one table (torchrec.distributed.types.CacheParams), same fields.

    `load_factor` (the fraction of rows cached in HBM under "fused_uvm_caching") is what rectoolkit's planner and
    cost model read. The others (algorithm: fbgemm's CacheAlgorithm LRU/LFU, reserved_memory, precision,
    prefetch_pipeline, stats, multipass_prefetch_config) are carried in the plan, into ParameterSharding.cache_params
    and to TorchRec by `to_torchrec`: rectoolkit's own kernels run no cache (on CPU "fused_uvm_caching" is the
    plain fused kernel; on GPU it is refused), so there is nothing for them to tune here.

        >>> CacheParams(load_factor=0.2).load_factor
        0.2
    """

    algorithm: Optional[Any] = None
    load_factor: Optional[float] = None
    reserved_memory: Optional[float] = None
    precision: Optional[Any] = None
    prefetch_pipeline: Optional[bool] = None
    stats: Optional[Any] = None
    multipass_prefetch_config: Optional[Any] = None

    def __post_init__(self) -> None:
        if self.load_factor is not None and not 0 < float(self.load_factor) <= 1:
            raise ValueError(f"CacheParams: load_factor must be in (0, 1], got {self.load_factor}")

    def __hash__(self) -> int:
        return hash((self.algorithm, self.load_factor, self.reserved_memory, self.precision, self.prefetch_pipeline,
                     self.multipass_prefetch_config))


@dataclass
class _ShardingSpec:
    """Stands in for TorchRec's EnumerableShardingSpec: only `.shards`."""

    shards: List[ShardMetadata]


@dataclass
class ParameterSharding:
    """How one table is sharded: the type, the compute kernel, the ranks and the exact shards.

    `sharding_type` and `compute_kernel` are stored as TorchRec's strings; `ShardingType` members are
    accepted. For DATA_PARALLEL, `shards` holds one full-table replica per rank.

    TorchRec's per-table options ride along as TorchRec puts them (from the table's ParameterConstraints):
    `cache_params`, `enforce_hbm`, `stochastic_rounding`, `bounds_check_mode`, `output_dtype`. The sharded
    collections check them against what they run (rectoolkit.distributed.sharded_ebc.check_table_options).
    """

    sharding_type: str
    compute_kernel: str = EmbeddingComputeKernel.FUSED.value
    ranks: Optional[List[int]] = None
    shards: List[ShardMetadata] = field(default_factory=list)
    cache_load_factor: Optional[float] = None  # fused_uvm_caching: fraction of rows cached in HBM
    cache_params: Optional[CacheParams] = None
    enforce_hbm: Optional[bool] = None
    stochastic_rounding: Optional[bool] = None
    bounds_check_mode: Optional[Any] = None  # fbgemm's BoundsCheckMode
    output_dtype: Optional[Any] = None  # a DataType

    def __post_init__(self) -> None:
        self.sharding_type = ShardingType.parse(self.sharding_type).value
        self.compute_kernel = EmbeddingComputeKernel.parse(self.compute_kernel).value
        if self.cache_load_factor is None and self.cache_params is not None \
                and self.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value:
            self.cache_load_factor = getattr(self.cache_params, "load_factor", None)
        self.shards = list(self.shards)
        if self.ranks is not None:
            self.ranks = [int(r) for r in self.ranks]

    @property
    def type(self) -> ShardingType:
        return ShardingType(self.sharding_type)

    @property
    def kernel(self) -> EmbeddingComputeKernel:
        return EmbeddingComputeKernel(self.compute_kernel)

    @property
    def sharding_spec(self) -> Optional[_ShardingSpec]:
        return _ShardingSpec(self.shards) if self.shards else None


def _tabulate(rows: Sequence[Sequence[object]], headers: Sequence[str]) -> str:
    """TorchRec's plan table layout: centred headers, '-' rule, ' | ' separators, left-justified cells."""
    if not rows:  # TorchRec sizes columns from the rows only: no rows, empty header and rule
        return "\n"
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(str(cell))) for w, cell in zip(widths, row)]
    lines = [" | ".join(h.center(w) for h, w in zip(headers, widths)), " | ".join("-" * w for w in widths)]
    lines += [" | ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


class EmbeddingModuleShardingPlan(Dict[str, ParameterSharding]):
    """Table name -> ParameterSharding for one embedding module; prints as TorchRec prints it."""

    def __str__(self) -> str:
        params = [[name, ps.sharding_type, ps.compute_kernel, ps.ranks] for name, ps in self.items()]
        shards = [
            [name, shard.shard_offsets, shard.shard_sizes, shard.placement]
            for name, ps in self.items()
            if ps.sharding_type != ShardingType.DATA_PARALLEL.value  # TorchRec keeps no spec for replicas
            for shard in ps.shards
        ]
        return (
            "\n\n" + _tabulate(params, ["param", "sharding type", "compute kernel", "ranks"])
            + "\n\n" + _tabulate(shards, ["param", "shard offsets", "shard sizes", "placement"])
        )


@dataclass
class ShardingPlan:
    """Module path -> table name -> ParameterSharding. `plan.plan[""]` is the plan of a top-level collection."""

    plan: Dict[str, EmbeddingModuleShardingPlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.plan = {path: EmbeddingModuleShardingPlan(tables) for path, tables in self.plan.items()}

    def get_plan_for_module(self, module_path: str) -> Optional[EmbeddingModuleShardingPlan]:
        return self.plan.get(module_path)

    def items(self) -> Iterator[Tuple[str, str, ParameterSharding]]:
        """Every (module path, table name, ParameterSharding) in the plan."""
        for path, tables in self.plan.items():
            for table, ps in tables.items():
                yield path, table, ps

    def ranks_used(self) -> List[int]:
        return sorted({shard.rank for _, _, ps in self.items() for shard in ps.shards})

    def __str__(self) -> str:
        return "\n\n".join("module: " + path + str(tables) for path, tables in self.plan.items())
