"""Exact bytes that a sharding plan moves between ranks, per collective, for one training step.

This module is the single definition of the wire protocol. The planner's cost model prices these bytes,
and the sharded modules (rectoolkit.distributed) send exactly these bytes through their instrumented
collectives, so the measured rank x rank matrices equal the ones computed here for the same batch.

The protocol, for a table with shards s (rank(s), rows(s) = [r0, r1), cols(s) = [c0, c1)), feature f of
that table, and source rank i with a local batch of B_i samples (every rank knows every B_i):

* ``input_dist`` (all non-DATA_PARALLEL tables): for every shard s and feature f, rank i sends to rank(s)
  the lengths of f in its batch restricted to rows(s) as int32 (4 * B_i bytes) and the ids of f that fall in
  rows(s) as int64 (8 bytes each), plus one float32 weight per id if the collection is weighted (4 bytes
  each). A TABLE_WISE/(TABLE_)COLUMN_WISE shard covers all rows, so it gets every id; row-wise shards get the ids of
  their row block. Column shards on one rank are still sent separately (one "bag" per shard).
* pooled outputs (EmbeddingBagCollection), TABLE_WISE / COLUMN_WISE / TABLE_COLUMN_WISE / ROW_WISE:
  ``output_dist``: rank(s) sends to every rank i the [B_i, cols(s)] float32 pooled (for row-wise: partial)
  sums of f: 4 * B_i * cols(s) bytes. Row-wise partial sums are added by the receiver (a reduce-scatter
  done as an all-to-all, which gloo supports).
* pooled outputs, TABLE_ROW_WISE / GRID_SHARD (two levels; L = local_world_size ranks per host,
  host(r) = r // L, local(r) = r % L):
  ``output_dist_intra``: rank(s) sends its partial [B_i, cols(s)] for destination i to the gateway
  g = host(rank(s)) * L + local(i) (a rank in its own host); ``output_dist_inter``: for each column block
  c of the table (on host h), gateway g = h * L + local(i) sends the reduced [B_i, cols(c)] to i.
  Only reduced sums cross hosts.
* sequence outputs (EmbeddingCollection, one row per id), every type but DATA_PARALLEL:
  ``output_dist``: rank(s) sends to i one float32 row slice per id of f in rows(s): 4 * n_ids * cols(s).
* a batch size per feature (VBE: rank i's batch has S_i(f) samples of feature f, padded to B_i = the largest
  with empty bags): every type but DATA_PARALLEL sends f's own bags only, after a header of one int32 count per
  feature shard: ``input_dist`` carries 4 * (1 + S_i(f)) length bytes in place of 4 * B_i, and the pooled outputs
  S_i(f) in place of B_i: ``output_dist`` 4 * S_i(f) * cols(s); TABLE_ROW_WISE / GRID_SHARD
  ``output_dist_intra`` 4 * S_i(f) * cols(s) and ``output_dist_inter`` 4 * S_i(f) * cols(c). So that a
  two-level gateway can add up and forward each feature's blocks at their own size, rank i's header to each of
  its gateways (g = h * L + local(i), one on every host h that holds a column block of f's table) also carries
  one int32 count per (table, feature): 4 more ``input_dist`` bytes. `batch_id_counter` reads the S_i(f) off the
  batches (its counter's ``feature_batch_sizes``); a counter without them means every feature has B_i. The
  planner's estimate (`expected_id_counter`'s ``feature_batch_sizes``) prices the batch a collection gets when
  its features' ParameterConstraints.batch_sizes differ in just this way (B_i = the largest, S_i(f) = f's), so it
  equals this over a real VBE batch with those sizes; a collection whose features share one batch size is a plain
  batch. The sequence EmbeddingCollection sends no count and pads its lengths to B_i (4 * B_i, as without VBE).
* backward: every output collective c has ``c + "_backward"`` = transpose of c (gradients of the outputs
  go back the same way). Input distribution has no backward (ids carry no gradient).
* quantized communication (`qcomm_codecs_registry`, TorchRec's get_qcomm_codecs_registry): the output values
  and their gradients travel at the width of the registry's forward and backward codecs (2 bytes for FP16 and
  BF16) in place of 4: the entry POOLED_EMBEDDINGS_ALL_TO_ALL for pooled ``output_dist`` (ROW_WISE's:
  POOLED_EMBEDDINGS_REDUCE_SCATTER) and ``output_dist_inter``, POOLED_EMBEDDINGS_REDUCE_SCATTER for
  ``output_dist_intra``, SEQUENCE_EMBEDDINGS_ALL_TO_ALL for sequence outputs; an op without an entry stays float32.
* ``dp_allreduce`` (DATA_PARALLEL tables): the table's dense float32 gradient (N = rows * cols values) is
  all-reduced (one backend all-reduce of every table's gradient), counted per table as a reduce-scatter then an
  all-gather over W ranks with chunk k holding N // W + (1 if k < N % W else 0) values (`allreduce_values_to`): on
  2 ranks rank i sends chunk j to each rank j, then its own chunk i to each rank j, so bytes[i][j] =
  4 * (chunk_j + chunk_i); on more a ring: rank i sends rank i + 1 (mod W) 4 * (2N - chunk_{i+1} - chunk_{i+2})
  bytes, all the chunks but one in each phase, and no other rank anything.

* ``sync_allreduce`` (a 2D layout, DMPCollection.sync(): not part of a step; `sync_traffic`): the world is
  sharding groups of G ranks (`peer_matrix`), each holding the group's plan; every rank all-reduces each tensor
  it holds (each shard's weight at its table's element size, then the fused optimizer's float32 state of the
  shard) over its replica group (the ranks at its position in every group, R = W / G of them, in that order) as
  dp_allreduce does: on 2 replicas replica i sends replica j size * (chunk_j + chunk_i) bytes per tensor (R
  chunks), on more the ring's bytes to the next replica.

Not priced here: the control message ``metadata`` that opens every input_dist (each rank tells every owner,
itself included, its batch size and id count: two int64, 16 bytes per rank pair, once per sharding-type group
of a sharded collection; a VBE batch sends -(1 + lengths sent) as its batch size). The sharded modules count it under its own name (CONTROL_COLLECTIVES), apart from
the data above.

Matrices are indexed [source rank, destination rank]; the diagonal is data a rank "sends" to itself (it
crosses no link, and the time model ignores it).

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.plan.types import ParameterSharding, ShardMetadata
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> plan = {"t": ParameterSharding("table_wise", ranks=[1], shards=[ShardMetadata.on_rank(1, 0, 0, 10, 4)])}
    >>> m = step_traffic(plan, [t], world_size=2, local_world_size=2, batch_sizes=[2, 2],
    ...                  count_ids=lambda rank, feature, lo, hi: 3)
    >>> m["input_dist"].tolist()  # each rank: 2 lengths * 4 B + 3 ids * 8 B to rank 1
    [[0, 32], [0, 32]]
    >>> m["output_dist"].tolist()  # rank 1 sends [2, 4] float32 back to each rank
    [[0, 0], [32, 32]]
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from rectoolkit.modules.configs import BaseEmbeddingConfig, EmbeddingBagConfig, PoolingType
from rectoolkit.plan.types import ParameterSharding, ShardingType

LENGTH_BYTES = 4  # int32 lengths
ID_BYTES = 8  # int64 ids
WEIGHT_BYTES = 4  # float32 per-id weights
VALUE_BYTES = 4  # float32 embeddings and gradients

FORWARD_COLLECTIVES = ("input_dist", "output_dist", "output_dist_intra", "output_dist_inter")
BACKWARD_COLLECTIVES = ("output_dist_backward", "output_dist_intra_backward", "output_dist_inter_backward",
                        "dp_allreduce")
COLLECTIVES = FORWARD_COLLECTIVES + BACKWARD_COLLECTIVES
CONTROL_COLLECTIVES = ("metadata",)  # counted by the sharded modules, not priced (see above)

# count_ids(source_rank, feature, row_start, row_end) -> ids of `feature` in that rank's batch with
# row_start <= id < row_end (an exact count for a real batch, an expectation for a planner estimate).
IdCounter = Callable[[int, str, int, int], float]

TWO_LEVEL = (ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD)


def is_pooled(table: BaseEmbeddingConfig) -> bool:
    return isinstance(table, EmbeddingBagConfig) and table.pooling != PoolingType.NONE


def step_traffic(
    module_plan: Mapping[str, ParameterSharding],
    tables: Sequence[BaseEmbeddingConfig],
    world_size: int,
    local_world_size: int,
    batch_sizes: Sequence[int],
    count_ids: IdCounter,
    is_weighted: bool = False,
    qcomm_codecs_registry: Optional[Mapping[str, Any]] = None,
) -> Dict[str, np.ndarray]:
    """Bytes per collective for one forward+backward step: name -> [W, W] matrix (source, destination).

    Tables missing from `module_plan` are skipped. Exact when `count_ids` counts a real batch.
    `qcomm_codecs_registry`: the collections' wire precisions (see the protocol above); None: float32.
    """
    if len(batch_sizes) != world_size:
        raise ValueError(f"step_traffic: batch_sizes has {len(batch_sizes)} entries for world_size {world_size}")
    if local_world_size <= 0 or world_size % local_world_size:
        raise ValueError(f"step_traffic: world_size {world_size} is not a multiple of local_world_size {local_world_size}")
    dtype = np.float64 if _counts_are_fractional(count_ids) else np.int64
    out = {name: np.zeros((world_size, world_size), dtype=dtype) for name in COLLECTIVES}
    id_bytes = ID_BYTES + (WEIGHT_BYTES if is_weighted else 0)
    L = local_world_size
    feature_batch_sizes = getattr(count_ids, "feature_batch_sizes", None) or [None] * world_size
    for table in tables:
        ps = module_plan.get(table.name)
        if ps is None:
            continue
        kind = ShardingType(ps.sharding_type)
        if kind == ShardingType.DATA_PARALLEL:
            _add_dp_allreduce(out["dp_allreduce"], table.num_embeddings * table.embedding_dim, world_size)
            continue
        pooled = is_pooled(table)
        op = ("SEQUENCE_EMBEDDINGS_ALL_TO_ALL" if not pooled else "POOLED_EMBEDDINGS_REDUCE_SCATTER"
              if kind == ShardingType.ROW_WISE else "POOLED_EMBEDDINGS_ALL_TO_ALL")
        widths = output_value_bytes(qcomm_codecs_registry, op)
        intra_widths = output_value_bytes(qcomm_codecs_registry, "POOLED_EMBEDDINGS_REDUCE_SCATTER")
        for feature in table.feature_names:
            # the bags of `feature` rank i sends and gets back: its own (VBE) or B_i; and its count header
            bags = [batch_sizes[i] if not pooled or own is None else own[feature]
                    for i, own in enumerate(feature_batch_sizes)]
            header = [0 if not pooled or own is None else 1 for own in feature_batch_sizes]
            for shard in ps.shards:
                owner = shard.rank
                row_start, row_end = shard.rows
                cols = shard.shard_sizes[1]
                for src in range(world_size):
                    n_ids = count_ids(src, feature, row_start, row_end)
                    out["input_dist"][src, owner] += LENGTH_BYTES * (header[src] + bags[src]) + id_bytes * n_ids
                    if not pooled:  # sequence rows go straight back to the rank that asked
                        _add_output(out, "output_dist", owner, src, cols * n_ids, widths)
                    elif kind in TWO_LEVEL:
                        gateway = (owner // L) * L + src % L
                        _add_output(out, "output_dist_intra", owner, gateway, bags[src] * cols, intra_widths)
                    else:
                        _add_output(out, "output_dist", owner, src, bags[src] * cols, widths)
            if pooled and kind in TWO_LEVEL:
                blocks = _column_blocks(ps, L)
                for host in set(blocks.values()):  # the count header to each gateway on the table's hosts
                    for src in range(world_size):
                        out["input_dist"][src, host * L + src % L] += LENGTH_BYTES * header[src]
                for (col_start, col_end), host in blocks.items():
                    for dst in range(world_size):
                        gateway = host * L + dst % L
                        _add_output(out, "output_dist_inter", gateway, dst, bags[dst] * (col_end - col_start),
                                    widths)
    return out


def peer_matrix(world_size: int, sharding_group_size: int, use_inter_host_allreduce: bool = False) -> List[List[int]]:
    """A 2D layout's sharding groups (rows) of global ranks, TorchRec's DMPCollection layout: strided (group k:
    ranks k, k + W/G, ...; a shard's replicas neighbours), or contiguous (group k: ranks kG .. kG + G - 1) with
    `use_inter_host_allreduce`. Column p of every row is one replica group.

        >>> peer_matrix(world_size=8, sharding_group_size=4), peer_matrix(8, 4, use_inter_host_allreduce=True)
        ([[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1, 2, 3], [4, 5, 6, 7]])
    """
    if isinstance(sharding_group_size, bool) or not isinstance(sharding_group_size, int) or \
            sharding_group_size <= 0 or world_size % sharding_group_size:
        raise ValueError(f"DMPCollection: sharding_group_size={sharding_group_size} does not divide the world size "
                         f"{world_size}; pass a sharding group size that divides the number of ranks")
    groups = world_size // sharding_group_size
    if use_inter_host_allreduce:
        return [list(range(k * sharding_group_size, (k + 1) * sharding_group_size)) for k in range(groups)]
    return [[groups * position + k for position in range(sharding_group_size)] for k in range(groups)]


def sync_traffic(module_plan: Mapping[str, ParameterSharding], tables: Sequence[BaseEmbeddingConfig],
                 world_size: int, sharding_group_size: int, use_inter_host_allreduce: bool = False,
                 optimizer: Any = None) -> np.ndarray:
    """Bytes one DMPCollection.sync() sends for one collection ("sync_allreduce", see the protocol above): a
    [W, W] matrix over global ranks (source, destination). `module_plan`: the sharding group's plan (ranks
    0..G-1); `optimizer`: the collection's fused optimizer (EmbOptimType or its name), whose state is synced with
    the weights (None: weights only, as sync(include_optimizer_state=False) or SGD); DATA_PARALLEL replicas have no
    fused state.

        >>> from rectoolkit.modules.configs import EmbeddingBagConfig
        >>> from rectoolkit.plan.types import ShardMetadata
        >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
        >>> plan = {"t": ParameterSharding("table_wise", ranks=[1], shards=[ShardMetadata.on_rank(1, 0, 0, 10, 4)])}
        >>> sync_traffic(plan, [t], world_size=4, sharding_group_size=2).tolist()  # replicas of group rank 1: 2, 3
        [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 160, 160], [0, 0, 160, 160]]
    """
    matrix = peer_matrix(world_size, sharding_group_size, use_inter_host_allreduce)
    out = np.zeros((world_size, world_size), dtype=np.int64)
    for table in tables:
        ps = module_plan.get(table.name)
        if ps is None:
            continue
        for rank, values, dtype in synced_tensors(table, ps, optimizer):
            replicas = [group[rank] for group in matrix]
            for i, src in enumerate(replicas):
                out[src, replicas] += dtype.itemsize * np.asarray(allreduce_values_to(values, len(matrix), i))
    return out


def synced_tensors(table: BaseEmbeddingConfig, ps: ParameterSharding, optimizer: Any = None) -> List[Tuple[int, int, Any]]:
    """What DMPCollection.sync() averages of one table, a tensor at a time: (group rank, values, torch dtype): each
    shard's weight in the table's dtype, then each state of `optimizer` (None: weights only) for the shard, float32
    (row-wise Adagrad's: one value per row); a DATA_PARALLEL replica has no fused state."""
    import torch

    from rectoolkit.kernels.fused_optimizers import optimizer_state_names
    from rectoolkit.kernels.optimizer_state import EmbOptimType
    from rectoolkit.modules.mixed_dtypes import table_dtype

    fused = ShardingType(ps.sharding_type) != ShardingType.DATA_PARALLEL
    states = optimizer_state_names(optimizer) if optimizer is not None and fused else ()
    rowwise = optimizer is not None and EmbOptimType.parse(optimizer) == EmbOptimType.ROWWISE_ADAGRAD
    out = []
    for shard in ps.shards:
        rows, cols = shard.shard_sizes
        out.append((shard.rank, rows * cols, table_dtype(table.data_type)))
        out += [(shard.rank, rows if rowwise else rows * cols, torch.float32) for _ in states]
    return out


def output_value_bytes(qcomm_codecs_registry: Optional[Mapping[str, Any]], comm_op: str) -> Tuple[int, int]:
    """(forward, backward) bytes per output value of the collectives that use registry entry `comm_op` (a
    CommOp name): its codecs' wire widths, or float32's without a registry or an entry.

        >>> output_value_bytes(None, "POOLED_EMBEDDINGS_ALL_TO_ALL")
        (4, 4)
    """
    codecs = None if qcomm_codecs_registry is None else qcomm_codecs_registry.get(comm_op)
    if codecs is None:
        return VALUE_BYTES, VALUE_BYTES
    return codecs.forward.quantized_dtype.itemsize, codecs.backward.quantized_dtype.itemsize


def _add_output(out: Dict[str, np.ndarray], name: str, src: int, dst: int, values: float,
                widths: Tuple[int, int]) -> None:
    """`values` output values from src to dst in collective `name`, and their gradients back in its backward."""
    out[name][src, dst] += widths[0] * values
    out[name + "_backward"][dst, src] += widths[1] * values


def dp_chunk_sizes(num_values: int, world_size: int) -> list:
    """Values in each rank's chunk when a gradient of num_values is reduce-scattered."""
    base, extra = divmod(num_values, world_size)
    return [base + (1 if k < extra else 0) for k in range(world_size)]


def allreduce_values_to(num_values: int, world_size: int, rank: int) -> List[int]:
    """Values `rank` sends each rank (by rank in the group) when num_values are all-reduced as the engine counts one
    all-reduce (rectoolkit.distributed.replicas): a reduce-scatter then an all-gather of the chunks of
    dp_chunk_sizes. On 2 ranks (or 1) each rank j gets chunk_j, then the sender's own chunk: chunk_j + chunk_rank
    to every rank j, its own included. On more, a ring: everything goes to the next rank, each phase all the
    chunks but one (the next rank's chunk in the reduce-scatter, the one after it in the all-gather).

        >>> allreduce_values_to(10, 2, 0), allreduce_values_to(10, 4, 1)
        ([10, 10], [0, 0, 16, 0])
    """
    chunks = dp_chunk_sizes(num_values, world_size)
    if world_size <= 2:
        return [chunk + chunks[rank] for chunk in chunks]
    out = [0] * world_size
    out[(rank + 1) % world_size] = 2 * num_values - chunks[(rank + 1) % world_size] - chunks[(rank + 2) % world_size]
    return out


def _add_dp_allreduce(matrix: np.ndarray, num_values: int, world_size: int) -> None:
    for src in range(world_size):
        matrix[src] += VALUE_BYTES * np.asarray(allreduce_values_to(num_values, world_size, src))


def _column_blocks(ps: ParameterSharding, local_world_size: int) -> Dict[tuple, int]:
    """(col_start, col_end) -> host, for a two-level table; each column block lives on exactly one host."""
    blocks: Dict[tuple, int] = {}
    for shard in ps.shards:
        host = shard.rank // local_world_size
        previous = blocks.setdefault(shard.columns, host)
        if previous != host:
            raise ValueError(
                f"{ps.sharding_type} table has columns {shard.columns} on hosts {previous} and {host}; "
                "each column block of a two-level table must stay inside one host"
            )
    return blocks


def _counts_are_fractional(count_ids: IdCounter) -> bool:
    return bool(getattr(count_ids, "fractional", False))


def batch_id_counter(batches: Sequence[object]) -> IdCounter:
    """An exact IdCounter over one KeyedJaggedTensor per rank (any object with TorchRec's KJT API); for a batch
    with a batch size per feature (VBE) it also carries each feature's samples (`feature_batch_sizes`)."""
    ids_by_rank = []
    for kjt in batches:
        ids_by_rank.append({key: jt.values() for key, jt in kjt.to_dict().items()})

    def count_ids(rank: int, feature: str, row_start: int, row_end: int) -> int:
        ids = ids_by_rank[rank].get(feature)
        if ids is None:
            raise KeyError(f"rank {rank}'s batch has no feature {feature!r}")
        return int(((ids >= row_start) & (ids < row_end)).sum())

    count_ids.feature_batch_sizes = [  # type: ignore[attr-defined]
        dict(zip(kjt.keys(), map(int, kjt.stride_per_key()))) if kjt.variable_stride_per_key() else None
        for kjt in batches]
    return count_ids


def expected_id_counter(
    batch_sizes: Sequence[int], pooling_factors: Mapping[str, float], num_rows: Mapping[str, int],
    feature_batch_sizes: Optional[Sequence[Optional[Mapping[str, int]]]] = None,
) -> IdCounter:
    """An IdCounter for estimates: B * pooling_factor ids per feature, spread uniformly over the rows.

    num_rows maps each feature to its table's row count. `feature_batch_sizes` (one mapping per rank, feature ->
    samples; what `batch_id_counter` carries for a VBE batch) prices a batch with a batch size per feature: feature
    f brings S_i(f) * pooling_factor ids, and step_traffic sends its own bags after the VBE count headers.

        >>> count = expected_id_counter([4, 4], {"user": 2.0, "item": 1.0}, {"user": 10, "item": 10},
        ...                             feature_batch_sizes=[{"user": 1, "item": 4}] * 2)
        >>> count(0, "user", 0, 5), count(0, "item", 0, 10), count.feature_batch_sizes[1]["user"]
        (1.0, 4.0, 1)
    """
    sizes_by_rank = list(feature_batch_sizes) if feature_batch_sizes is not None else [None] * len(batch_sizes)
    if len(sizes_by_rank) != len(batch_sizes):
        raise ValueError(f"expected_id_counter: feature_batch_sizes has {len(sizes_by_rank)} entries for "
                         f"{len(batch_sizes)} ranks; give one mapping (feature -> samples) per rank")

    def count_ids(rank: int, feature: str, row_start: int, row_end: int) -> float:
        own = sizes_by_rank[rank]
        samples = batch_sizes[rank] if own is None else own[feature]
        return samples * pooling_factors.get(feature, 1.0) * (row_end - row_start) / num_rows[feature]

    count_ids.fractional = True  # type: ignore[attr-defined]
    if feature_batch_sizes is not None:
        count_ids.feature_batch_sizes = [None if own is None else dict(own)  # type: ignore[attr-defined]
                                         for own in sizes_by_rank]
    return count_ids


def batch_sizes_of(batches: Sequence[object]) -> list:
    """Local batch size of each rank's KJT, B_i: with a batch size per feature (VBE) the largest feature's (the
    sharded types send each feature's own bags, which `batch_id_counter` reads off the batches)."""
    return [int(max(kjt.stride_per_key(), default=0)) if kjt.variable_stride_per_key() else int(kjt.stride())
            for kjt in batches]
