"""Every way to shard one table: sharding type x compute kernel x column block, cut as TorchRec cuts them.

An option is a shape, not yet a placement. Its shards come in `num_groups` identical groups, and the search
picks a location for each group:

* kind "rank": one shard per group, placed on a rank (TABLE_WISE: 1 group; COLUMN_WISE: one per column block;
  TABLE_COLUMN_WISE: one per column block, every block on a rank of the first block's host);
* kind "host": the ranks of one host hold a group's row blocks (TABLE_ROW_WISE: 1 group; GRID_SHARD: one
  per column block);
* kind "fixed": no choice (ROW_WISE: a row block on every rank; DATA_PARALLEL: a replica on every rank).

Row blocks follow TorchRec: ceil(rows / n) rows each, the last one shorter, any left over ranks empty.

    >>> row_blocks(10, 4)
    [(0, 3), (3, 3), (6, 3), (9, 1)]
    >>> column_block_sizes(128, min_partition=32, max_blocks=8)
    [64, 32]
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from rectoolkit.plan.constructors import placement
from rectoolkit.plan.types import (
    CPU_KERNELS,
    CUDA_KERNELS,
    EmbeddingComputeKernel,
    ParameterSharding,
    ShardingType,
    ShardMetadata,
)
from rectoolkit.planner.tables import PlannerTable
from rectoolkit.planner.topology import Topology

DEFAULT_MIN_PARTITION = 32  # TorchRec's MIN_CW_DIM is 128; smaller blocks give the search more choices
DEFAULT_CACHE_LOAD_FACTOR = 0.2
MAX_COLUMN_BLOCK_CHOICES = 3

POOLED_TYPES = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE,
                ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD, ShardingType.DATA_PARALLEL,
                ShardingType.TABLE_COLUMN_WISE)
SEQUENCE_TYPES = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE,
                  ShardingType.DATA_PARALLEL)
# Kernels in order of speed: the search takes the first one that fits.
KERNEL_SPEED_ORDER = (EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.DENSE,
                      EmbeddingComputeKernel.FUSED_UVM_CACHING, EmbeddingComputeKernel.FUSED_UVM)

# COLUMN_WISE / TABLE_COLUMN_WISE / GRID_SHARD with a single column block (no split allowed) are TABLE_WISE /
# TABLE_WISE / TABLE_ROW_WISE.
DUPLICATE_OF = {ShardingType.COLUMN_WISE: ShardingType.TABLE_WISE, ShardingType.TABLE_COLUMN_WISE: ShardingType.TABLE_WISE,
                ShardingType.GRID_SHARD: ShardingType.TABLE_ROW_WISE}
COLUMN_SPLIT = (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD)

KIND_OF = {
    ShardingType.TABLE_WISE: "rank", ShardingType.COLUMN_WISE: "rank", ShardingType.TABLE_COLUMN_WISE: "rank",
    ShardingType.TABLE_ROW_WISE: "host", ShardingType.GRID_SHARD: "host",
    ShardingType.ROW_WISE: "fixed", ShardingType.DATA_PARALLEL: "fixed",
}


class RankTime(NamedTuple):
    """A "rank" option's group (table-wise, column-wise blocks): ms on the rank that owns it, on each other rank of
    its host, and on each rank of another host."""

    owner_ms: float
    mate_ms: float
    outside_ms: float


class HostTime(NamedTuple):
    """A "host" option's group (table-row-wise, grid blocks): ms on each rank of the host that owns it ([L]) and on
    each rank of another host."""

    inside_ms: np.ndarray
    outside_ms: float


@dataclass
class ShardingOption:
    """One way to shard one table (before placement). Costs are filled in by rectoolkit.planner.cost."""

    table_index: int
    sharding_type: ShardingType
    compute_kernel: EmbeddingComputeKernel
    block_columns: int  # columns per group (the whole dim except COLUMN_WISE / TABLE_COLUMN_WISE / GRID_SHARD)
    num_groups: int
    cache_load_factor: Optional[float] = None
    # cost templates (filled by CostModel.fill_many): one group's time wherever it is placed, by kind
    time_ms: Union[RankTime, HostTime, np.ndarray, None] = None  # rank: RankTime; host: HostTime; fixed: [W] ms
    hbm_bytes: Union[float, np.ndarray, None] = None  # rank: the owner's bytes; host: [L], one per local rank; fixed: [W]
    ddr_bytes: Union[float, np.ndarray, None] = None
    bytes_per_group: float = 0.0  # total off-diagonal bytes one group moves per step
    total_time_ms: float = 0.0  # sum over ranks of the option's time, placement independent
    least_time_ms: float = 0.0  # the least time it adds to every rank, wherever it is placed
    peak_bytes: float = 0.0  # the most HBM plus the most DDR it puts on one rank
    # host kind, VBE pooled tables: the count header every rank sends the gateway of its local index on each host
    # that holds a group (once per host, however many groups it holds): ms on each rank inside, outside; bytes
    host_count_ms: Tuple[float, float] = (0.0, 0.0)
    host_count_bytes: float = 0.0
    fixed_vectors: object = None  # fixed kind: [3, W] time, HBM, DDR stacked (rectoolkit.planner.state.fixed_vectors)

    def __post_init__(self) -> None:
        # read often by the search: plain strings and ints hash faster than enum members
        self.kind = KIND_OF[self.sharding_type]  # "rank", "host" or "fixed"
        self.one_host = self.sharding_type == ShardingType.TABLE_COLUMN_WISE  # "rank" groups kept on one host
        self.shape = (self.sharding_type.value, self.block_columns, self.num_groups)  # the option less its kernel
        self.speed_rank = KERNEL_SPEED_ORDER.index(self.compute_kernel) if self.compute_kernel in KERNEL_SPEED_ORDER \
            else len(KERNEL_SPEED_ORDER)

    @property
    def label(self) -> str:
        text = f"{self.sharding_type.value}/{self.compute_kernel.value}"
        if self.sharding_type in COLUMN_SPLIT:
            text += f" ({self.num_groups}x{self.block_columns} cols)"
        return text

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_group * self.num_groups


def row_blocks(rows: int, num_blocks: int) -> List[Tuple[int, int]]:
    """(offset, size) of TorchRec's row blocks: ceil(rows / n) each, the rest on the last, then empty."""
    block = math.ceil(rows / num_blocks)
    out, offset = [], 0
    for _ in range(num_blocks):
        size = max(0, min(block, rows - offset))
        out.append((offset, size))
        offset += size
    return out


def column_block_sizes(dim: int, min_partition: int, max_blocks: int) -> List[int]:
    """Column block widths below `dim` that divide it, are multiples of 4, at least min_partition wide,
    and give at most max_blocks blocks; widest first, at most MAX_COLUMN_BLOCK_CHOICES of them."""
    sizes = [b for b in range(dim - 1, 0, -1)
             if dim % b == 0 and b % 4 == 0 and b >= min_partition and dim // b <= max_blocks]
    return sizes[:MAX_COLUMN_BLOCK_CHOICES]


def enumerate_options(table: PlannerTable, index: int, topology: Topology) -> List[ShardingOption]:
    """All options for one table that its constraints allow. Raises ValueError when none is left."""
    c = table.constraints
    allowed_types = SEQUENCE_TYPES if not table.pooled else POOLED_TYPES
    if table.quantized:  # quantized collections are sharded, never replicated (rectoolkit.quant.sharding)
        allowed_types = tuple(t for t in allowed_types if t != ShardingType.DATA_PARALLEL)
    if c is not None and c.allowed_sharding_types() is not None:
        wanted = c.allowed_sharding_types()
        types = [t for t in allowed_types if t in wanted]
    else:
        types = list(allowed_types)
    min_partition = int(c.min_partition) if c is not None and c.min_partition else DEFAULT_MIN_PARTITION
    clf = (c.cache_load_factor if c is not None and c.cache_load_factor else DEFAULT_CACHE_LOAD_FACTOR)
    options: List[ShardingOption] = []
    for sharding_type in types:
        splits = _column_splits(sharding_type, table.dim, min_partition, topology)
        if splits == [(table.dim, 1)] and DUPLICATE_OF.get(sharding_type) in types:
            continue  # one column block: the same shards and costs as the type it duplicates
        if sharding_type == ShardingType.TABLE_COLUMN_WISE and topology.num_hosts == 1 \
                and ShardingType.COLUMN_WISE in types:
            continue  # one host: COLUMN_WISE's options, already there
        for kernel in _kernels_for(sharding_type, table, topology):
            for block, groups in splits:
                options.append(ShardingOption(
                    index, sharding_type, kernel, block, groups,
                    cache_load_factor=clf if kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING else None))
    if not options:
        raise ValueError(
            f"constraints leave no sharding option for table {table.label!r} "
            f"({c.describe() if c is not None else 'no constraints'}; "
            f"{'sequence' if not table.pooled else 'pooled'} table, compute_device={topology.compute_device!r}); "
            "DATA_PARALLEL needs the 'dense' kernel, the others 'fused' / 'fused_uvm' / 'fused_uvm_caching'"
            + ("; sequence tables support table_wise, column_wise, row_wise, data_parallel" if not table.pooled else "")
        )
    return options


def _kernels_for(sharding_type: ShardingType, table: PlannerTable, topology: Topology) -> List[EmbeddingComputeKernel]:
    c = table.constraints
    wanted = c.allowed_compute_kernels() if c is not None else None
    if table.quantized:
        supported = [EmbeddingComputeKernel.QUANT]  # the kernel rectoolkit.quant's sharded collections run
    elif sharding_type == ShardingType.DATA_PARALLEL:
        supported = [EmbeddingComputeKernel.DENSE]
    elif wanted is not None:  # explicit requests may use any training kernel but "dense", which is DATA_PARALLEL's
        # (TorchRec's sharders offer it there only, so compute_kernels=["dense"] makes a table data-parallel)
        supported = [k for k in KERNEL_SPEED_ORDER if k != EmbeddingComputeKernel.DENSE]
    else:
        supported = list(CUDA_KERNELS if topology.uses_hbm else CPU_KERNELS)
    if wanted is None:
        return supported
    return [k for k in supported if k in wanted]


def _column_splits(sharding_type: ShardingType, dim: int, min_partition: int, topology: Topology) -> List[Tuple[int, int]]:
    """(columns per group, number of groups) choices for a sharding type."""
    if sharding_type in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        max_blocks = topology.world_size  # TABLE_COLUMN_WISE: several blocks may share a rank, as in TorchRec
    elif sharding_type == ShardingType.GRID_SHARD:
        max_blocks = topology.num_hosts
    else:
        return [(dim, 1)]
    sizes = column_block_sizes(dim, min_partition, max_blocks)
    return [(b, dim // b) for b in sizes] or [(dim, 1)]


def option_shards(option: ShardingOption, table: PlannerTable, locations: Sequence[int],
                  topology: Topology) -> List[ShardMetadata]:
    """The exact shards of an option placed at `locations` (a rank or host per group; none for fixed)."""
    return [_shard(*block, placements(topology)) for block in _option_blocks(option, table, locations, topology)]


def _option_blocks(option: ShardingOption, table: PlannerTable, locations: Sequence[int],
                   topology: Topology) -> List[Tuple[int, int, int, int, int]]:
    """(rank, row offset, column offset, rows, columns) of each of the option's shards, in the plan's order."""
    W, L = topology.world_size, topology.local_world_size
    rows, dim, b = table.rows, table.dim, option.block_columns
    kind = option.sharding_type
    if kind == ShardingType.DATA_PARALLEL:
        return [(r, 0, 0, rows, dim) for r in range(W)]
    if kind == ShardingType.ROW_WISE:
        return [(r, off, 0, size, dim) for r, (off, size) in enumerate(row_blocks(rows, W))]
    if option.kind == "rank":
        return [(int(rank), 0, g * b, rows, b) for g, rank in enumerate(locations)]
    host_blocks = row_blocks(rows, L)
    return [(int(host) * L + local, off, g * b, size, b)
            for g, host in enumerate(locations) for local, (off, size) in enumerate(host_blocks)]


def _shard(rank: int, row_offset: int, col_offset: int, num_rows: int, num_cols: int,
           rank_placements: Sequence[str]) -> ShardMetadata:
    # values are valid by construction: skip ShardMetadata's checks (plans can hold ~10^6 shards)
    made = object.__new__(ShardMetadata)
    object.__setattr__(made, "shard_offsets", [int(row_offset), int(col_offset)])
    object.__setattr__(made, "shard_sizes", [int(num_rows), int(num_cols)])
    object.__setattr__(made, "placement", rank_placements[rank])
    return made


def placements(topology: Topology) -> Tuple[str, ...]:
    """Every rank's placement string (rectoolkit.plan.constructors.placement), made once per topology shape."""
    return _placements(topology.compute_device, topology.world_size, topology.local_world_size)


@functools.lru_cache(maxsize=64)
def _placements(compute_device: str, world_size: int, local_world_size: int) -> Tuple[str, ...]:
    return tuple(placement(compute_device, rank, local_world_size) for rank in range(world_size))


def to_parameter_sharding(option: ShardingOption, table: PlannerTable, locations: Sequence[int],
                          topology: Topology) -> ParameterSharding:
    blocks = _option_blocks(option, table, locations, topology)
    rank_placements = placements(topology)
    shards = [_shard(*block, rank_placements) for block in blocks]
    ranks = [block[0] for block in blocks]
    if option.sharding_type in (ShardingType.TABLE_ROW_WISE,):
        ranks = sorted(set(ranks))
    c = table.constraints  # TorchRec's per-table options ride along in the plan, as its planner puts them
    return ParameterSharding(option.sharding_type.value, option.compute_kernel.value, ranks=ranks, shards=shards,
                             cache_load_factor=option.cache_load_factor,
                             **{name: getattr(c, name) for name in CARRIED_OPTIONS if c is not None})


# the ParameterConstraints fields that TorchRec's planner copies into each ParameterSharding
CARRIED_OPTIONS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")
