"""Plan types: how each table is cut into shards and which rank holds each shard.

Plain dataclasses with TorchRec's names, so `plan.plan[""]["user_table"].sharding_type` reads the same.

    >>> shard = ShardMetadata(shard_offsets=[0, 0], shard_sizes=[100, 8], placement="rank:1/cpu")
    >>> shard.rank
    1
    >>> ps = ParameterSharding(ShardingType.TABLE_WISE, "fused", [1], EnumerableShardingSpec([shard]))
    >>> ps.sharding_type, ps.shards == [shard]
    ('table_wise', True)
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

    `placement` reads like TorchRec's: "rank:<rank>/<device>" (a string, or torch's `_remote_device`, kept as its
    string). As in TorchRec it may be left out while a plan is being written; a plan whose shard has no placement
    is refused when it is checked or sharded, naming the table and the shard.
    """

    shard_offsets: List[int]
    shard_sizes: List[int]
    placement: Optional[str] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shard_offsets", [int(x) for x in self.shard_offsets])
        object.__setattr__(self, "shard_sizes", [int(x) for x in self.shard_sizes])
        if len(self.shard_offsets) != 2 or len(self.shard_sizes) != 2:
            raise ValueError(
                f"ShardMetadata: offsets {self.shard_offsets} and sizes {self.shard_sizes} must be [rows, columns]"
            )
        if min(self.shard_offsets) < 0 or min(self.shard_sizes) < 0:
            raise ValueError(f"ShardMetadata: negative offset or size in {self.shard_offsets} / {self.shard_sizes}")
        if self.placement is None:
            return
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
        return int(self._placed().split("/")[0].split(":")[1])

    @property
    def device(self) -> str:
        parts = self._placed().split("/", 1)
        return parts[1] if len(parts) > 1 else "cpu"

    def __repr__(self) -> str:  # as TorchRec's (torch's ShardMetadata): the placement unquoted
        return (f"ShardMetadata(shard_offsets={self.shard_offsets}, shard_sizes={self.shard_sizes}, "
                f"placement={self.placement})")

    def _placed(self) -> str:
        if self.placement is None:
            raise ValueError(f"ShardMetadata(shard_offsets={self.shard_offsets}, shard_sizes={self.shard_sizes}) has no "
                             "placement: say which rank holds it, e.g. placement='rank:0/cpu' (or 'rank:0/cuda:0')")
        return self.placement

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
class EnumerableShardingSpec:
    """TorchRec's sharding_spec of a ParameterSharding (torch.distributed._shard's EnumerableShardingSpec): the
    table's shards, listed."""

    shards: List[ShardMetadata]


@dataclass(init=False)
class ParameterSharding:
    """How one table is sharded: the type, the compute kernel, the ranks and the exact shards.

    Takes TorchRec's arguments in TorchRec's order: `ParameterSharding(sharding_type, compute_kernel, ranks,
    sharding_spec, cache_params, enforce_hbm, stochastic_rounding, bounds_check_mode, output_dtype,
    key_value_params)`. `sharding_type` and `compute_kernel` are stored as TorchRec's strings; `ShardingType`
    members are accepted. `sharding_spec` is an EnumerableShardingSpec (this module's or torch's, as TorchRec
    builds them) or a plain list of ShardMetadata; its shards are kept in `shards` (also a keyword), and
    `sharding_spec` reads them back. For DATA_PARALLEL, `shards` holds one full-table replica per rank.

    `compute_kernel` defaults to "fused", and to "dense" for DATA_PARALLEL: a replica has the dense kernel only
    (TorchRec's sharders offer it no other), so another kernel on a DATA_PARALLEL entry is refused, not ignored.

        >>> ParameterSharding("data_parallel", ranks=[0, 1]).compute_kernel
        'dense'
        >>> ParameterSharding("data_parallel", "fused", ranks=[0, 1])
        Traceback (most recent call last):
        ...
        ValueError: ParameterSharding: a data_parallel table has compute_kernel 'fused', but a replica runs the dense kernel only (a plain parameter updated by your dense optimizer, as in TorchRec); use compute_kernel="dense" (or leave it out)

    TorchRec's per-table options ride along as TorchRec puts them (from the table's ParameterConstraints):
    `cache_params`, `enforce_hbm`, `stochastic_rounding`, `bounds_check_mode`, `output_dtype`. The sharded
    collections check them against what they run (rectoolkit.distributed.sharded_ebc.check_table_options).
    `key_value_params` (TorchRec's key-value / SSD tables) is refused: there is no key-value kernel here.
    `cache_load_factor` (keyword only) is the fraction of rows a "fused_uvm_caching" table caches.
    """

    sharding_type: str
    compute_kernel: str
    ranks: Optional[List[int]]
    shards: List[ShardMetadata]
    cache_load_factor: Optional[float]  # fused_uvm_caching: fraction of rows cached in HBM
    cache_params: Optional[CacheParams]
    enforce_hbm: Optional[bool]
    stochastic_rounding: Optional[bool]
    bounds_check_mode: Optional[Any]  # fbgemm's BoundsCheckMode
    output_dtype: Optional[Any]  # a DataType

    def __init__(self, sharding_type: Union[ShardingType, str],
                 compute_kernel: Optional[Union[EmbeddingComputeKernel, str]] = None,
                 ranks: Optional[Sequence[int]] = None, sharding_spec: Any = None,
                 cache_params: Optional[CacheParams] = None, enforce_hbm: Optional[bool] = None,
                 stochastic_rounding: Optional[bool] = None, bounds_check_mode: Optional[Any] = None,
                 output_dtype: Optional[Any] = None, key_value_params: Optional[Any] = None, *,
                 shards: Optional[Sequence[ShardMetadata]] = None, cache_load_factor: Optional[float] = None) -> None:
        if key_value_params is not None:
            raise NotImplementedError(
                f"ParameterSharding: key_value_params={key_value_params!r} (TorchRec's key-value / SSD tables) is not "
                "supported: rectoolkit has no key-value kernel; leave it None")
        if sharding_spec is not None and shards is not None:
            raise TypeError("ParameterSharding: give the shards once, as sharding_spec=EnumerableShardingSpec([...]) "
                            "(TorchRec's) or as shards=[...], not both")
        self.sharding_type = ShardingType.parse(sharding_type).value
        self.compute_kernel = _kernel_for(ShardingType(self.sharding_type), compute_kernel).value
        self.ranks = [int(r) for r in ranks] if ranks is not None else None
        self.shards = _shards_of(sharding_spec if sharding_spec is not None else shards)
        self.cache_params = cache_params
        self.enforce_hbm = enforce_hbm
        self.stochastic_rounding = stochastic_rounding
        self.bounds_check_mode = bounds_check_mode
        self.output_dtype = output_dtype
        self.cache_load_factor = cache_load_factor
        if cache_load_factor is None and cache_params is not None \
                and self.compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value:
            self.cache_load_factor = getattr(cache_params, "load_factor", None)

    @property
    def type(self) -> ShardingType:
        return ShardingType(self.sharding_type)

    @property
    def kernel(self) -> EmbeddingComputeKernel:
        return EmbeddingComputeKernel(self.compute_kernel)

    def __repr__(self) -> str:
        """TorchRec's fields in TorchRec's order (the shards as its sharding_spec); cache_load_factor after them,
        when set."""
        fields = [("sharding_type", self.sharding_type), ("compute_kernel", self.compute_kernel), ("ranks", self.ranks),
                  ("sharding_spec", self.sharding_spec), ("cache_params", self.cache_params),
                  ("enforce_hbm", self.enforce_hbm), ("stochastic_rounding", self.stochastic_rounding),
                  ("bounds_check_mode", self.bounds_check_mode), ("output_dtype", self.output_dtype),
                  ("key_value_params", None)]
        if self.cache_load_factor is not None:
            fields.append(("cache_load_factor", self.cache_load_factor))
        return "ParameterSharding(" + ", ".join(f"{name}={value!r}" for name, value in fields) + ")"

    @property
    def sharding_spec(self) -> Optional[EnumerableShardingSpec]:
        """TorchRec's view of the shards (None while there are none, as for a DATA_PARALLEL table TorchRec plans)."""
        return EnumerableShardingSpec(self.shards) if self.shards else None


def _kernel_for(sharding_type: ShardingType,
                compute_kernel: Optional[Union[EmbeddingComputeKernel, str]]) -> EmbeddingComputeKernel:
    """The kernel asked for, or the default: "dense" for DATA_PARALLEL (its only kernel), "fused" otherwise."""
    if compute_kernel is None:
        return EmbeddingComputeKernel.DENSE if sharding_type == ShardingType.DATA_PARALLEL \
            else EmbeddingComputeKernel.FUSED
    kernel = EmbeddingComputeKernel.parse(compute_kernel)
    check_data_parallel_kernel(sharding_type, kernel, "ParameterSharding")
    return kernel


def check_data_parallel_kernel(sharding_type: Union[ShardingType, str], kernel: Union[EmbeddingComputeKernel, str],
                               subject: str) -> None:
    """Refuse a DATA_PARALLEL entry with a kernel other than "dense": TorchRec's sharders offer DATA_PARALLEL the
    DENSE kernel only (its lookup is a plain replica under DDP), so any other kernel would be ignored. `subject`
    says whose entry it is (the table, where known)."""
    kernel = EmbeddingComputeKernel.parse(kernel)
    if ShardingType.parse(sharding_type) == ShardingType.DATA_PARALLEL and kernel != EmbeddingComputeKernel.DENSE:
        raise ValueError(f"{subject}: a data_parallel table has compute_kernel {kernel.value!r}, but a replica runs "
                         "the dense kernel only (a plain parameter updated by your dense optimizer, as in TorchRec); "
                         "use compute_kernel=\"dense\" (or leave it out)")


def _shards_of(spec: Any) -> List[ShardMetadata]:
    """The shards of a sharding_spec (anything with `.shards`: this module's or torch's EnumerableShardingSpec) or
    of a list of shards, as this module's ShardMetadata (torch's keep their offsets, sizes and placement)."""
    if spec is None:
        return []
    listed = spec.shards if hasattr(spec, "shards") else spec
    if isinstance(listed, (str, bytes)) or not hasattr(listed, "__iter__"):
        raise TypeError(f"ParameterSharding: sharding_spec must be an EnumerableShardingSpec or a list of "
                        f"ShardMetadata, got {type(spec).__name__}")
    shards = []
    for shard in listed:
        if isinstance(shard, ShardMetadata):
            shards.append(shard)
        elif hasattr(shard, "shard_offsets") and hasattr(shard, "shard_sizes"):
            placement = getattr(shard, "placement", None)
            shards.append(ShardMetadata(list(shard.shard_offsets), list(shard.shard_sizes),
                                        str(placement) if placement is not None else None))
        else:
            raise TypeError(f"ParameterSharding: a shard must be a ShardMetadata, got {type(shard).__name__}")
    return shards


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


class ModuleShardingPlan:
    """The plan of one module (TorchRec's base class): EmbeddingModuleShardingPlan for the embedding collections."""

    def _serialize(self) -> dict:
        raise NotImplementedError(f"{type(self).__name__} does not serialize itself; see rectoolkit.plan.serialization")


class EmbeddingModuleShardingPlan(ModuleShardingPlan, Dict[str, ParameterSharding]):
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
