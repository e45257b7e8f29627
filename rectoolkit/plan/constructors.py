"""Hand-written plans, TorchRec's way: one generator per sharding type (torchrec.distributed.sharding_plan).

`table_wise(rank=1)`, `row_wise()`, `column_wise(ranks=[0, 1])`, `table_row_wise(host_index=1)`,
`table_column_wise(host_index=1)` (rectoolkit's), `grid_shard(host_indexes=[0, 1])` and `data_parallel()` each return a *generator*: a function of
(parameter, local_size, world_size, device_type, sharder) that gives the table's ParameterSharding.
`construct_module_sharding_plan` (rectoolkit.quant.shard_modules, where the default sharders live) calls one per
table. The shards are TorchRec's, to the row and column:

* ROW_WISE / TABLE_ROW_WISE: blocks of ceil(rows / n) rows, the remainder on the next rank, then empty blocks
  (10 rows on 4 ranks: 3, 3, 3, 1; 5 rows on 4 ranks: 2, 2, 1, 0);
* COLUMN_WISE with `ranks`: blocks of the smallest width >= dim / len(ranks) that divides dim and is a multiple
  of 4 (the whole dim when none is), paired with `ranks` in order;
* GRID_SHARD: column blocks as COLUMN_WISE with the default 128-column minimum, each row-wise over a host;
* DATA_PARALLEL: a replica on every rank (TorchRec keeps no shards for it; rectoolkit's plans list the replicas).

The compute kernel is TorchRec's default: "dense" for DATA_PARALLEL and for weights without a fused optimizer,
"fused" for weights that have one (`_apply_optimizer_in_backward`, or a collection built with a fused optimizer).

    >>> import torch
    >>> weight = torch.nn.Parameter(torch.empty(10, 8))
    >>> ps = row_wise()(weight, 4, 4, "cpu", None)
    >>> [shard.shard_sizes for shard in ps.shards], ps.ranks
    ([[3, 8], [3, 8], [3, 8], [1, 8]], [0, 1, 2, 3])
    >>> table_wise(rank=1)(weight, 2, 2, "cuda", None).shards[0].placement
    'rank:1/cuda:1'
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch

from rectoolkit.plan.types import EmbeddingComputeKernel, ParameterSharding, ShardingType, ShardMetadata

# (parameter, local_size, world_size, device_type, sharder) -> the parameter's ParameterSharding
ParameterShardingGenerator = Callable[[torch.Tensor, int, int, str, Any], ParameterSharding]

MIN_CW_DIM = 128  # TorchRec's default smallest column block (planner.constants.MIN_CW_DIM)

Size = List[int]  # [rows, columns]


def placement(compute_device: str, rank: int, local_size: int) -> str:
    """TorchRec's placement of a shard on `rank`: the local device index on accelerators.

    >>> placement("cuda", 3, 2), placement("cpu", 3, 2)
    ('rank:3/cuda:1', 'rank:3/cpu')
    """
    if compute_device in ("cuda", "mtia"):
        return f"rank:{rank}/{compute_device}:{rank % local_size}"
    return f"rank:{rank}/{compute_device}"


def placement_helper(device_type: str, index: int = 0, rank: int = 0) -> str:
    """TorchRec's placement for an explicit device (inference plans): a CPU shard always reads "rank:0/cpu".

    >>> placement_helper("cuda", 1, 3), placement_helper("cpu", 1, 3)
    ('rank:3/cuda:1', 'rank:0/cpu')
    """
    if device_type == "cpu":
        return f"rank:0/{device_type}"
    return f"rank:{rank}/{device_type}:{index}"


def get_device_type() -> str:
    """The device type TorchRec shards onto when none is given: "cuda" when one is available, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def get_local_size(world_size: int) -> int:
    """TorchRec's ranks per host: LOCAL_WORLD_SIZE (or the MPI equivalents), else 8; `world_size` when that does
    not divide it.

    >>> get_local_size(6) if "LOCAL_WORLD_SIZE" not in os.environ else 6
    6
    """
    local_size = 8
    for name in ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"):
        if int(os.environ.get(name, -1)) >= 0:
            local_size = int(os.environ[name])
            break
    if local_size <= 0 or world_size % local_size != 0:
        local_size = world_size
    return local_size


def row_block_sizes(rows: int, num_blocks: int, num_buckets: Optional[int] = None) -> List[int]:
    """Rows per block: ceil(rows / n) each, the rest, then empty; with `num_buckets`, whole buckets of
    rows / num_buckets rows, one more on the first ranks.

    >>> row_block_sizes(10, 4), row_block_sizes(5, 4), row_block_sizes(10, 4, num_buckets=5)
    ([3, 3, 3, 1], [2, 2, 1, 0], [4, 2, 2, 2])
    """
    if num_buckets:
        if num_buckets < num_blocks:
            raise ValueError(f"row_wise(num_buckets={num_buckets}): needs at least as many buckets as ranks "
                             f"({num_blocks}), a bucket cannot be split across ranks; raise num_buckets")
        if rows % num_buckets:
            raise ValueError(f"row_wise(num_buckets={num_buckets}): the table's {rows} rows do not divide into "
                             f"{num_buckets} buckets; pick a divisor of {rows}")
        per_rank, extra = divmod(num_buckets, num_blocks)
        return [rows // num_buckets * (per_rank + (rank < extra)) for rank in range(num_blocks)]
    block = math.ceil(rows / num_blocks)
    return [max(0, min(block, rows - block * rank)) for rank in range(num_blocks)]


def column_block_width(columns: int, lower_bound: Optional[int] = None) -> int:
    """TorchRec's column block: the smallest width >= lower_bound (default 128) below `columns` that divides it
    and is a multiple of 4; `columns` itself when there is none.

    >>> column_block_width(64, 32), column_block_width(10, 5), column_block_width(512)
    (32, 10, 128)
    """
    lower = lower_bound if lower_bound else MIN_CW_DIM
    return next((width for width in range(lower, columns) if columns % width == 0 and width % 4 == 0), columns)


def _row_shards(rows: int, columns: int, num_blocks: int, num_buckets: Optional[int] = None) -> List[Tuple[Size, Size]]:
    sizes = row_block_sizes(rows, num_blocks, num_buckets)
    offsets = [sum(sizes[:rank]) for rank in range(num_blocks)]
    return [([size, columns], [offset, 0]) for size, offset in zip(sizes, offsets)]


def _column_shards(rows: int, columns: int, lower_bound: Optional[int]) -> List[Tuple[Size, Size]]:
    width = column_block_width(columns, lower_bound)
    return [([rows, width], [0, width * block]) for block in range(columns // width)]


def _uneven_shards(length: int, sizes: Sequence[int], axis: int, rows: int, columns: int, what: str
                   ) -> List[Tuple[Size, Size]]:
    """Blocks of the given sizes along `axis` (0 rows, 1 columns), clipped at the end; all of `length` covered."""
    shards, start = [], 0
    for size in sizes:
        end = min(start + int(size), length)
        block = [end - start, columns] if axis == 0 else [rows, end - start]
        offset = [start, 0] if axis == 0 else [0, start]
        shards.append((block, offset))
        start = end
    if start < length:
        raise ValueError(f"{what}={list(sizes)}: they cover {start} of the table's {length} "
                         f"{'rows' if axis == 0 else 'columns'} ([{rows}, {columns}]); make them add up to {length}")
    return shards


def _default_kernel(param: torch.Tensor, sharding_type: ShardingType) -> str:
    if sharding_type != ShardingType.DATA_PARALLEL and hasattr(param, "_in_backward_optimizers"):
        return EmbeddingComputeKernel.FUSED.value
    return EmbeddingComputeKernel.DENSE.value


def _sharding(param: torch.Tensor, sharding_type: ShardingType, shards: Sequence[Tuple[Size, Size, int]],
              local_size: int, device_type: str, placements: Optional[Sequence[str]] = None,
              compute_kernel: Optional[str] = None) -> ParameterSharding:
    """The ParameterSharding of (size, offset, rank) shards, placed by `placements` or on each rank's device."""
    where = list(placements) if placements else [placement(device_type, rank, local_size) for _, _, rank in shards]
    metadata = [ShardMetadata(offset, size, at) for (size, offset, _), at in zip(shards, where)]
    return ParameterSharding(sharding_type.value, compute_kernel or _default_kernel(param, sharding_type),
                             ranks=[rank for _, _, rank in shards], shards=metadata)


def data_parallel() -> ParameterShardingGenerator:
    """A full replica of the table on every rank (kernel "dense").

    >>> data_parallel()(torch.empty(4, 2), 2, 2, "cpu", None).ranks
    [0, 1]
    """
    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        shards = [([rows, columns], [0, 0], rank) for rank in range(world_size)]
        return _sharding(param, ShardingType.DATA_PARALLEL, shards, local_size, device_type)

    return generate


def table_wise(rank: int, device: Optional[str] = None, compute_kernel: Optional[str] = None
               ) -> ParameterShardingGenerator:
    """The whole table on `rank`; `device` places it explicitly (TorchRec's placement_helper), `compute_kernel`
    overrides the default kernel.

    >>> table_wise(rank=1)(torch.empty(4, 2), 2, 2, "cpu", None).shards[0].placement
    'rank:1/cpu'
    """
    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        placements = [placement_helper(device, rank, rank)] if device else None
        return _sharding(param, ShardingType.TABLE_WISE, [([rows, columns], [0, 0], rank)], local_size, device_type,
                         placements, compute_kernel)

    return generate


def row_wise(sizes_placement: Optional[Tuple[List[int], Union[str, List[str]]]] = None,
             compute_kernel: Optional[str] = None, num_buckets: Optional[int] = None) -> ParameterShardingGenerator:
    """Row blocks over all ranks. `sizes_placement` = (rows per rank, device or a device per rank) gives uneven
    blocks for inference (kernel "quant", as in TorchRec); `num_buckets` keeps whole buckets on a rank.

    >>> [s.shard_sizes[0] for s in row_wise(([3, 7], "cpu"))(torch.empty(9, 2), 2, 2, "cpu", None).shards]
    [3, 6]
    """
    if sizes_placement is not None and not isinstance(sizes_placement[1], str) \
            and len(sizes_placement[0]) != len(sizes_placement[1]):
        raise ValueError(f"row_wise(sizes_placement={sizes_placement}): give one device per row block "
                         f"({len(sizes_placement[0])} blocks, {len(sizes_placement[1])} devices)")
    if sizes_placement is not None:
        compute_kernel = EmbeddingComputeKernel.QUANT.value

    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        if sizes_placement is None:
            blocks = _row_shards(rows, columns, world_size, num_buckets)
            shards = [(size, offset, rank) for rank, (size, offset) in enumerate(blocks)]
            return _sharding(param, ShardingType.ROW_WISE, shards, local_size, device_type,
                             compute_kernel=compute_kernel)
        sizes, devices = sizes_placement
        blocks = _uneven_shards(rows, sizes, 0, rows, columns, "row_wise(sizes_placement) sizes")
        shards = [(size, offset, rank) for rank, (size, offset) in enumerate(blocks)]
        placements, index = [], 0
        for rank in range(len(sizes)):
            device = str(devices) if isinstance(devices, str) else devices[rank]
            placements.append(placement_helper(device, index, rank))
            index += device == "cuda"
        return _sharding(param, ShardingType.ROW_WISE, shards, local_size, device_type, placements, compute_kernel)

    return generate


def column_wise(ranks: Optional[List[int]] = None, size_per_rank: Optional[List[int]] = None,
                compute_kernel: Optional[str] = None, device_types: Optional[List[str]] = None
                ) -> ParameterShardingGenerator:
    """Column blocks: even blocks on `ranks` (ranks may repeat), or `size_per_rank` columns on ranks 0, 1, ...;
    `device_types` places each block explicitly.

    >>> [(s.shard_offsets, s.rank) for s in column_wise(ranks=[1, 0])(torch.empty(4, 8), 2, 2, "cpu", None).shards]
    [([0, 0], 1), ([0, 4], 0)]
    """
    if ranks is None and size_per_rank is None:
        raise ValueError("column_wise(): pass ranks=[...] (even column blocks on those ranks) or size_per_rank=[...]")

    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        if size_per_rank is None:
            if columns % len(ranks):
                raise ValueError(f"column_wise(ranks={ranks}): the table's {columns} columns do not divide evenly "
                                 f"across {len(ranks)} ranks; use size_per_rank=[...] or as many ranks as divide it")
            blocks = _column_shards(rows, columns, columns // len(ranks))
            shards = [(size, offset, rank) for (size, offset), rank in zip(blocks, ranks)]
        else:
            blocks = _uneven_shards(columns, size_per_rank, 1, rows, columns, "column_wise(size_per_rank)")
            shards = [(size, offset, rank) for rank, (size, offset) in enumerate(blocks)]
        placements = None
        if device_types is not None:
            if len(device_types) != len(shards):
                raise ValueError(f"column_wise(device_types={device_types}): give one device per column block "
                                 f"({len(shards)} blocks)")
            placements, index = [], 0
            for device in device_types:
                placements.append(placement_helper(device, index, index))
                index += device != "cpu"
        return _sharding(param, ShardingType.COLUMN_WISE, shards, local_size, device_type, placements, compute_kernel)

    return generate


def table_row_wise(host_index: int) -> ParameterShardingGenerator:
    """Row blocks over the `local_size` ranks of host `host_index`.

    >>> table_row_wise(host_index=1)(torch.empty(5, 2), 2, 4, "cpu", None).ranks
    [2, 3]
    """
    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        blocks = _row_shards(rows, columns, local_size)
        shards = [(size, offset, host_index * local_size + local) for local, (size, offset) in enumerate(blocks)]
        return _sharding(param, ShardingType.TABLE_ROW_WISE, shards, local_size, device_type)

    return generate


def table_column_wise(host_index: int, compute_kernel: Optional[str] = None) -> ParameterShardingGenerator:
    """Even column blocks over the `local_size` ranks of host `host_index`, block k on its k-th rank.
    rectoolkit's: TorchRec 1.8 plans TABLE_COLUMN_WISE only through its planner (no generator).

    >>> [(s.shard_offsets, s.rank) for s in table_column_wise(host_index=1)(torch.empty(4, 8), 2, 4, "cpu", None).shards]
    [([0, 0], 2), ([0, 4], 3)]
    """
    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        if not 0 <= host_index < world_size // local_size:
            raise ValueError(f"table_column_wise(host_index={host_index}): there are {world_size // local_size} hosts "
                             f"of {local_size} ranks; give a host index 0..{world_size // local_size - 1}")
        if columns % local_size:
            raise ValueError(f"table_column_wise(host_index={host_index}): the table's {columns} columns do not "
                             f"divide evenly across the host's {local_size} ranks; use column_wise(size_per_rank=...)")
        width = columns // local_size
        shards = [([rows, width], [0, width * local], host_index * local_size + local) for local in range(local_size)]
        return _sharding(param, ShardingType.TABLE_COLUMN_WISE, shards, local_size, device_type,
                         compute_kernel=compute_kernel)

    return generate


def grid_shard(host_indexes: List[int]) -> ParameterShardingGenerator:
    """Column blocks (at least 128 columns wide, as TorchRec's default), block k row-wise over host
    `host_indexes[k]`; the table needs at least as many column blocks as hosts given.

    >>> grid_shard(host_indexes=[1, 0])(torch.empty(4, 256), 2, 4, "cpu", None).ranks
    [2, 3, 0, 1]
    """
    def generate(param: torch.Tensor, local_size: int, world_size: int, device_type: str, sharder: Any
                 ) -> ParameterSharding:
        rows, columns = param.shape
        column_blocks = _column_shards(rows, columns, None)
        if len(column_blocks) < len(host_indexes):
            raise ValueError(f"grid_shard(host_indexes={host_indexes}): a [{rows}, {columns}] table makes "
                             f"{len(column_blocks)} column block(s) of at least {MIN_CW_DIM} columns, fewer than the "
                             f"{len(host_indexes)} hosts; give at most {len(column_blocks)} host(s)")
        shards = []
        for block, host in enumerate(host_indexes):
            (_, width), (_, column_offset) = column_blocks[block]
            for local, (size, offset) in enumerate(_row_shards(rows, width, local_size)):
                shards.append((size, [offset[0], column_offset], host * local_size + local))
        return _sharding(param, ShardingType.GRID_SHARD, shards, local_size, device_type)

    return generate


def _memory_weighted_row_sizes(rows: int, device_memory_sizes: Sequence[int], num_buckets: Optional[int]) -> List[int]:
    """TorchRec's uneven row split: each rank but the last gets its memory's share of the buckets (rounded down),
    the last rank the rest."""
    total = sum(device_memory_sizes)
    if total <= 0 or any(size < 0 for size in device_memory_sizes):
        raise ValueError(f"device_memory_sizes={list(device_memory_sizes)}: give each rank's memory, non-negative and "
                         "not all zero")
    buckets, bucket_rows = (rows, 1) if num_buckets is None else (num_buckets, rows // num_buckets)
    sizes = [int(buckets * (size / total)) * bucket_rows for size in device_memory_sizes[:-1]]
    return sizes + [rows - sum(sizes)]


def calculate_shard_sizes_and_offsets(tensor: torch.Tensor, world_size: int, local_world_size: int,
                                      sharding_type: str, col_wise_shard_dim: Optional[int] = None,
                                      device_memory_sizes: Optional[List[int]] = None,
                                      num_buckets: Optional[int] = None) -> Tuple[List[Size], List[Size]]:
    """TorchRec's shard sizes and offsets of a [rows, columns] table for a sharding type (the shards the
    generators above place): row blocks of ceil(rows / n) over the world (row_wise; in proportion to
    `device_memory_sizes` when given) or over one host (table_row_wise), column blocks of at least
    `col_wise_shard_dim` (default 128) columns, grid = both.

    >>> calculate_shard_sizes_and_offsets(torch.empty(10, 8), 4, 2, "row_wise")
    ([[3, 8], [3, 8], [3, 8], [1, 8]], [[0, 0], [3, 0], [6, 0], [9, 0]])
    >>> calculate_shard_sizes_and_offsets(torch.empty(10, 8), 4, 2, "grid_shard", col_wise_shard_dim=4)
    ([[5, 4], [5, 4], [5, 4], [5, 4]], [[0, 0], [5, 0], [0, 4], [5, 4]])
    """
    rows, columns = tensor.shape
    kind = ShardingType.parse(sharding_type)
    if kind == ShardingType.DATA_PARALLEL:
        return [[rows, columns]] * world_size, [[0, 0]] * world_size
    if kind == ShardingType.TABLE_WISE:
        return [[rows, columns]], [[0, 0]]
    if kind == ShardingType.ROW_WISE:
        if num_buckets and num_buckets < world_size:
            raise ValueError(f"calculate_shard_sizes_and_offsets: num_buckets ({num_buckets}) must be >= the number "
                             f"of ranks ({world_size}): a bucket cannot be split across ranks; raise num_buckets")
        if device_memory_sizes:
            if len(device_memory_sizes) != world_size:
                raise ValueError(f"device_memory_sizes has {len(device_memory_sizes)} entries for {world_size} "
                                 "ranks; give one per rank")
            if num_buckets and rows % num_buckets:
                raise ValueError(f"num_buckets={num_buckets}: the table's {rows} rows do not divide into buckets; "
                                 f"pick a divisor of {rows}")
            sizes = _memory_weighted_row_sizes(rows, device_memory_sizes, num_buckets)
            shards = [([size, columns], [sum(sizes[:rank]), 0]) for rank, size in enumerate(sizes)]
        else:
            shards = _row_shards(rows, columns, world_size, num_buckets)
    elif kind == ShardingType.TABLE_ROW_WISE:
        shards = _row_shards(rows, columns, local_world_size)
    elif kind in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        shards = _column_shards(rows, columns, col_wise_shard_dim)
    else:  # GRID_SHARD: each column block row-wise over one host's ranks
        shards = [([size[0], width], [offset[0], column_offset])
                  for (_, width), (_, column_offset) in _column_shards(rows, columns, col_wise_shard_dim)
                  for size, offset in _row_shards(rows, width, local_world_size)]
    return [size for size, _ in shards], [offset for _, offset in shards]


def get_sharding_constructor_from_type(sharding_type: Union[ShardingType, str]) -> Callable[..., ParameterShardingGenerator]:
    """The generator constructor of a sharding type.

    >>> get_sharding_constructor_from_type("row_wise") is row_wise
    True
    """
    return {ShardingType.TABLE_WISE: table_wise, ShardingType.ROW_WISE: row_wise,
            ShardingType.COLUMN_WISE: column_wise, ShardingType.TABLE_ROW_WISE: table_row_wise,
            ShardingType.GRID_SHARD: grid_shard, ShardingType.DATA_PARALLEL: data_parallel,
            ShardingType.TABLE_COLUMN_WISE: table_column_wise,  # rectoolkit's; TorchRec's dict lacks it
            }[ShardingType.parse(sharding_type)]

