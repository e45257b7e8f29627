"""The pieces every sharding type is built from: feature shards, the local batch, and the three steps.

A *feature shard* is one (shard, feature) pair: the ids of feature f that a sharding type routes to shard s,
looked up (pooled, for bag collections) by the rank that owns s. A sharding type is a rule for which ids of a
feature each shard gets (its routing) and for how the results come back (its output combination); the wire
protocol (rectoolkit.plan.traffic) is defined per feature shard, and so is the code here:

    input_dist   ids_to_owners():      lengths (int32) then ids (int64) [then weights], shard by shard, to each owner
    lookup       LocalShards.lookup(): one batched-kernel call over every (source rank, feature shard) this rank owns
    output_dist  pooled_to_requesters() (one level); two_level.py (TABLE_ROW_WISE, GRID_SHARD)

The owner runs its kernel with one kernel "feature" per (source rank, feature shard), all with one batch size B,
so the received buffers are used as they arrive (no reordering). Ranks may bring different batch sizes:
input_dist tells every owner each source's B_i, the owner pads the lengths of smaller batches with empty bags up
to the largest B, and output_dist sends each source only its B_i columns (the bytes are the protocol's, per B_i).
A batch with a batch size per feature (VBE) goes further in the pooled collection: each feature shard carries only
its feature's own bags both ways (a "user" feature of 2 samples sends 2 lengths and gets 2 pooled rows back, in a
batch of 512 candidates). In the one-level types nothing is padded: the owner runs its kernel in variable-batch
mode (each (source rank, feature shard) at its own bags, LocalShards.variable_batch_lookup), the pooled rows go
back flat, [bags, cols] per feature shard (pooled_blocks_to_requesters), and the requesting rank expands them with
the inverse indices straight into the output, once (sharded_ebc.py, modules.layout.expand_blocks). The two-level
types carry each feature at its own batch size through both output levels too; their owners pad the bags like a
smaller source's, and the requesting rank expands the pooled rows once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

from rectoolkit.distributed.comm import (
    PendingExchange,
    ShardingEnv,
    all_to_all_with_grad,
    from_ragged,
    start_all_to_all,
    start_all_to_all_messages,
    to_ragged,
)
from rectoolkit.kernels.backend import fbgemm_available
from rectoolkit.kernels.batched_embedding import (
    BatchedEmbeddingKernel,
    TableSpec,
    make_batched_embedding,
    pad_bags,
    segment_positions,
    take_segments,
)
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig
from rectoolkit.modules.configs import BaseEmbeddingConfig
from rectoolkit.modules.layout import FeatureLayout
from rectoolkit.plan.types import ParameterSharding, ShardMetadata


@dataclass(frozen=True)
class FeatureShard:
    """One (shard, feature) pair: which ids go where, and where the result lands in the output."""

    table: str
    feature: str  # input feature name (a key of the KJT)
    output_key: str  # embedding name in the output ("feature" or "feature@table")
    shard_index: int  # position of the shard in the table's ParameterSharding.shards
    owner: int
    row_start: int
    row_end: int
    col_start: int
    col_end: int
    table_rows: int

    @property
    def cols(self) -> int:
        return self.col_end - self.col_start

    @property
    def full_rows(self) -> bool:
        return self.row_start == 0 and self.row_end == self.table_rows


def make_feature_shards(tables: Sequence[BaseEmbeddingConfig], output_keys: Sequence[Sequence[str]],
                        module_plan: Mapping[str, ParameterSharding], world_size: int) -> List[List[FeatureShard]]:
    """by_owner[rank]: the feature shards each rank serves, ordered by (table, shard, feature) - every rank agrees."""
    by_owner: List[List[FeatureShard]] = [[] for _ in range(world_size)]
    for table, keys in zip(tables, output_keys):
        ps = module_plan[table.name]
        check_shards_cover(table, ps)
        for shard_index, shard in enumerate(ps.shards):
            if shard.rank >= world_size:
                raise ValueError(f"table {table.name!r}: shard {shard_index} is placed on rank {shard.rank} but the "
                                 f"world size is {world_size}; re-plan for {world_size} ranks")
            for feature, key in zip(table.feature_names, keys):
                by_owner[shard.rank].append(FeatureShard(
                    table.name, feature, key, shard_index, shard.rank, *shard.rows, *shard.columns,
                    table.num_embeddings))
    return by_owner


def check_shards_cover(table: BaseEmbeddingConfig, ps: ParameterSharding) -> None:
    """Shards must tile the table exactly (each cell once), or the results would silently be wrong."""
    if not ps.shards:
        raise ValueError(f"table {table.name!r}: the plan has no shards for it ({ps.sharding_type})")
    cells = sum(s.num_elements for s in ps.shards)
    for k, s in enumerate(ps.shards):
        if s.rows[1] > table.num_embeddings or s.columns[1] > table.embedding_dim:
            raise ValueError(f"table {table.name!r} is {table.num_embeddings} x {table.embedding_dim} but shard {k} "
                             f"covers rows {s.rows}, columns {s.columns}")
    if cells != table.num_embeddings * table.embedding_dim:
        raise ValueError(f"table {table.name!r}: its shards cover {cells} cells, the table has "
                         f"{table.num_embeddings * table.embedding_dim}; the plan's shards must tile the table")


# ------------------------------------------------------------------------------------------------ local batch
@dataclass
class FeatureBatch:
    """This rank's KJT split per feature, with a cache of routed ids (shared by all groups)."""

    batch_size: int
    values: Dict[str, torch.Tensor]  # int64 ids
    lengths: Dict[str, torch.Tensor]  # int64, [B]
    weights: Dict[str, Optional[torch.Tensor]]
    value_starts: Dict[str, int]  # start of the feature's ids in the collection's concatenated values
    # VBE (a batch size per feature): each feature's own samples (its lengths are padded to batch_size with empty
    # bags); None for a plain batch, where every feature has batch_size samples
    strides: Optional[Dict[str, int]] = None
    _cache: Dict[tuple, "RoutedIds"] = field(default_factory=dict)
    _offsets: Dict[str, torch.Tensor] = field(default_factory=dict)

    def stride(self, feature: str) -> int:
        """The samples of `feature` (before padding)."""
        return self.batch_size if self.strides is None else self.strides[feature]

    @classmethod
    def from_kjt(cls, features, layout: FeatureLayout, weighted: bool, ids_out_of_range: str, rank: int,
                 device: Optional[torch.device] = None, variable_batch: bool = False) -> "FeatureBatch":
        """The collection's features (gathered and checked by its front door, rectoolkit.modules.layout), split.

        `variable_batch`: a batch size per feature is taken, every feature padded to the largest (empty bags)."""
        gathered = layout.gather(features, weighted, variable_batch)
        ids = layout.check_ids(gathered, ids_out_of_range, subject=f"rank {rank}: ")
        lengths, weights, stride = gathered.lengths, gathered.weights, gathered.batch_size
        if device is not None and ids.device != device:  # e.g. a CPU batch for CUDA shards
            ids, lengths = ids.to(device), lengths.to(device)
            weights = weights.to(device) if weights is not None else None
        names = layout.feature_names
        per_feature = lengths.view(len(names), stride).to(torch.int64)
        counts = per_feature.sum(1).tolist()
        starts = [0]
        for count in counts:
            starts.append(starts[-1] + count)
        strides = None
        if variable_batch and features.variable_stride_per_key():
            stride_of = dict(zip(features.keys(), features.stride_per_key()))
            strides = {name: int(stride_of[name]) for name in names}
        return cls(stride, dict(zip(names, ids.split(counts))), dict(zip(names, per_feature)),
                   dict(zip(names, weights.split(counts) if weights is not None else [None] * len(names))),
                   dict(zip(names, starts)), strides)

    def offsets(self, feature: str) -> torch.Tensor:
        """[batch_size + 1] int64: where each sample's ids of `feature` start in its values, and the end (once per
        batch)."""
        hit = self._offsets.get(feature)
        if hit is None:
            lengths = self.lengths[feature]
            hit = self._offsets[feature] = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
            torch.cumsum(lengths, 0, out=hit[1:])
        return hit

    def cached(self, keys: Sequence[tuple], compute: Callable[[List[tuple]], List["RoutedIds"]]) -> List["RoutedIds"]:
        """The RoutedIds of every key; compute(the keys not routed yet for this batch, each once) in one call
        (several groups and column blocks route the same row range)."""
        missing = [key for key in dict.fromkeys(keys) if key not in self._cache]
        if missing:
            self._cache.update(zip(missing, compute(missing)))
        return [self._cache[key] for key in keys]


class RoutedIds(NamedTuple):
    """The ids of one feature shard, as a sharding type's routing chose them from the local batch."""

    lengths: torch.Tensor  # [B] ids per sample
    ids: torch.Tensor  # int64, relative to the shard's first row
    weights: Optional[torch.Tensor]
    # where the ids sit in the collection's values (sequence outputs); None: all of the feature's, or not asked for
    positions: Optional[torch.Tensor]


# ------------------------------------------------------------------------------------------------ input_dist
@dataclass
class ReceivedIds:
    """What an owner received in input_dist, plus what the sender must remember to place the answers."""

    lengths: torch.Tensor  # int32, (source rank, feature shard, sample) order; source i has batch_sizes[i] samples
    ids: torch.Tensor  # int64, same order
    weights: Optional[torch.Tensor]
    batch_sizes: List[int]  # every source rank's local batch size
    ids_sent: List[List[int]] = field(default_factory=list)  # [owner][feature shard] ids this rank sent (sequence outputs)
    positions_sent: List[List[torch.Tensor]] = field(default_factory=list)  # where those ids sit in the output
    ids_received: List[int] = field(default_factory=list)  # per source rank
    # bags per feature shard: [source][my feature shard] received, [owner][its feature shard] sent; a source's
    # batch size for all of them, unless its batch has a batch size per feature (VBE) and the group sends
    # each feature's own bags (start_ids_to_owners' bags_per_feature)
    bags: List[List[int]] = field(default_factory=list)
    bags_sent: List[List[int]] = field(default_factory=list)
    batch_size: int = 0  # this rank's own (padded) batch size: the columns of its output block
    # two-level types (start_ids_to_owners' gateway_keys), VBE sources only: [source] {output key: bags} of the
    # keys this rank reduces as the source's gateway, and {output key: bags} of every key this rank asked for
    gateway_bags: List[Dict[str, int]] = field(default_factory=list)
    gateway_bags_sent: Dict[str, int] = field(default_factory=dict)
    # some source sent its bags per feature shard (VBE): then every owner runs its kernel at each feature
    # shard's own bags and the pooled rows travel flat (pooled_blocks_to_requesters); every rank knows it
    variable_batch: bool = False

    @property
    def padded_batch_size(self) -> int:
        """The batch size the owner's kernel runs with: the largest source's (shorter ones get empty bags)."""
        return max(self.batch_sizes) if self.batch_sizes else 0


# a sharding type's routing: the RoutedIds of every owner's feature shards (by_owner), [owner][feature shard]
Route = Callable[[FeatureBatch, Sequence[Sequence[FeatureShard]]], List[List[RoutedIds]]]


def ids_to_owners(env: ShardingEnv, batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]],
                  route: Route, weighted: bool, keep_positions: bool = False, bags_per_feature: bool = False,
                  gateway_keys: Optional[Sequence[Sequence[Tuple[str, str]]]] = None) -> ReceivedIds:
    """input_dist: for every feature shard, send the lengths (int32) and ids (int64) [and weights] that `route`
    picks for it to its owner.

    Two collectives: a "metadata" all-to-all tells each owner every source's batch size and id count (the
    ranks' batch sizes may differ), then one all-to-all carries each owner's ids, lengths [and weights].

    `bags_per_feature` (pooled outputs): a batch with a batch size per feature (VBE) sends each
    feature shard only its feature's own bags, after a header of one int32 count per feature shard; its
    metadata says so with a negative size, -(1 + lengths sent), so the message sizes stay known. Otherwise
    every feature shard gets the batch's B bags (shorter features padded with empty bags).

    `gateway_keys` (the two-level types, two_level.py), per host: the (output key, feature) pairs its gateways
    reduce. With VBE the header to each of the source's gateways (the rank of its local index on every host)
    then also holds one count per pair of the gateway's host, so that the gateway can add up and forward each
    feature's partial sums at that feature's own batch size.
    """
    return start_ids_to_owners(env, batch, by_owner, route, weighted, keep_positions, bags_per_feature,
                               gateway_keys).wait().wait()


def start_ids_to_owners(env: ShardingEnv, batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]],
                        route: Route, weighted: bool, keep_positions: bool = False, bags_per_feature: bool = False,
                        gateway_keys: Optional[Sequence[Sequence[Tuple[str, str]]]] = None) -> PendingExchange:
    """ids_to_owners in two stages, for the train pipeline: this starts the "metadata" all-to-all and returns;
    its `wait()` waits for the sizes and starts the ids' all-to-all, returning a PendingExchange whose `wait()`
    gives the ReceivedIds."""
    B, W = batch.batch_size, env.world_size
    own_bags = bags_per_feature and batch.strides is not None
    messages: List[List[torch.Tensor]] = []
    ids_sent: List[List[int]] = []
    positions_sent: List[List[torch.Tensor]] = []
    bags_sent: List[List[int]] = []
    routed_by_owner = route(batch, by_owner)
    for owner in range(W):
        routed = routed_by_owner[owner]
        bags = [batch.stride(shard.feature) if own_bags else B for shard in by_owner[owner]]
        lengths = [r.lengths[:n] for r, n in zip(routed, bags)] if own_bags else [r.lengths for r in routed]
        if own_bags:
            heard = [batch.stride(feature) for _, feature in _gateway_keys(gateway_keys, env, env.rank, owner)]
            lengths.insert(0, torch.tensor(bags + heard, dtype=torch.int32, device=env.device))
        message = [_cat([r.ids for r in routed], torch.int64, env.device), _cat(lengths, torch.int32, env.device)]
        if weighted:
            message.append(_cat([r.weights for r in routed], torch.float32, env.device))
        messages.append(message)
        ids_sent.append([r.ids.numel() for r in routed])
        bags_sent.append(bags)
        if keep_positions:
            positions_sent.append([r.positions if r.positions is not None else
                                   batch.value_starts[shard.feature] + torch.arange(r.ids.numel(), device=r.ids.device)
                                   for shard, r in zip(by_owner[owner], routed)])
    mine = len(by_owner[env.rank])
    gateway_bags_sent = {key: batch.stride(feature) for keys in (gateway_keys or []) for key, feature in keys} \
        if own_bags else {}

    def send_ids(received_sizes: torch.Tensor) -> PendingExchange:
        sizes = received_sizes.view(W, 2).tolist()
        # a negative size: that source sends its bags per feature shard (VBE), header included
        keys_heard = [_gateway_keys(gateway_keys, env, source, env.rank) for source in range(W)]
        lengths_numel = [mine * b if b >= 0 else mine + len(keys) - b - 1 for (b, _), keys in zip(sizes, keys_heard)]
        ids_received = [n for _, n in sizes]
        pending = start_all_to_all_messages(env, messages, [[n, count] + ([n] if weighted else [])
                                                            for (_, n), count in zip(sizes, lengths_numel)], "input_dist")

        def received(parts: List[torch.Tensor]) -> ReceivedIds:
            lengths, bags, batch_sizes = parts[1], [[b] * mine for b, _ in sizes], [b for b, _ in sizes]
            gateway_bags: List[Dict[str, int]] = [{} for _ in range(W)]
            if any(b < 0 for b, _ in sizes):  # take the headers out
                chunks = list(lengths.split(lengths_numel))
                for source, (b, _) in enumerate(sizes):
                    if b < 0:
                        header = chunks[source][:mine + len(keys_heard[source])].tolist()
                        bags[source] = header[:mine]
                        gateway_bags[source] = {key: n for (key, _), n in zip(keys_heard[source], header[mine:])}
                        batch_sizes[source] = max(bags[source], default=0)
                        chunks[source] = chunks[source][len(header):]
                lengths = torch.cat(chunks)
            return ReceivedIds(lengths, parts[0], parts[2] if weighted else None, batch_sizes, ids_sent,
                               positions_sent, ids_received, bags, bags_sent, B, gateway_bags, gateway_bags_sent,
                               any(b < 0 for b, _ in sizes) and gateway_keys is None)

        return pending.then(received)

    sizes_to_owners = torch.tensor([[-1 - sum(bags) if own_bags else B, sum(counts)]
                                    for bags, counts in zip(bags_sent, ids_sent)], dtype=torch.int64, device=env.device)
    return start_all_to_all(env, sizes_to_owners.view(-1), [2] * W, [2] * W, "metadata").then(send_ids)


def _gateway_keys(gateway_keys: Optional[Sequence[Sequence[Tuple[str, str]]]], env: ShardingEnv, source: int,
                  receiver: int) -> Sequence[Tuple[str, str]]:
    """The (output key, feature) pairs whose counts `source`'s VBE header to `receiver` carries for the gateway."""
    L = env.local_world_size
    if gateway_keys is None or source % L != receiver % L:
        return ()
    return gateway_keys[receiver // L]


def _cat(parts: List[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if not parts:
        return torch.empty(0, dtype=dtype, device=device)
    return (torch.cat(parts) if len(parts) > 1 else parts[0]).to(dtype)  # (cat promotes mixed dtypes; one cast)


# ------------------------------------------------------------------------------------------------ a group's inputs
@dataclass
class ShardingGroupSpec:
    """What one sharding group (the tables of one sharding type in one collection) is built from."""

    env: ShardingEnv
    tables: List[BaseEmbeddingConfig]
    output_keys: List[List[str]]  # per table, the output name of each of its features
    module_plan: Dict[str, ParameterSharding]  # the group's tables only (cut by the collection)
    key_offsets: Mapping[str, int]  # first output column of every output key (pooled outputs)
    pooled: bool  # EmbeddingBagCollection (True) or EmbeddingCollection
    weighted: bool
    optimizer: Optional[FusedOptimizerConfig]  # None: plain autograd weights
    initial_weights: Mapping[str, torch.Tensor]  # full tables to slice shards from; missing: init_fn
    backend: str = "auto"
    dtype: torch.dtype = torch.float32
    embedding_dim: int = 0  # sequence outputs: the collection's one dim
    # CommOp name -> QuantizedCommCodecs: the output exchanges' wire precisions (None: float32; fbgemm_qcomm_codec)
    qcomm_codecs_registry: Optional[Dict[str, Any]] = None

    def table(self, name: str) -> BaseEmbeddingConfig:
        return next(t for t in self.tables if t.name == name)


# ------------------------------------------------------------------------------------------------ lookup
class LocalShards(nn.Module):
    """The shards this rank owns for one sharding type, in one batched kernel (only these are allocated).

    `weights[f"{table}__{shard_index}"]` is the shard's Parameter (a view of the kernel's storage).
    """

    def __init__(self, spec: "ShardingGroupSpec", mine: Sequence[FeatureShard]) -> None:
        super().__init__()
        env = self.env = spec.env
        self.pooled = spec.pooled
        self.shard_keys: List[Tuple[str, int]] = []
        for piece in mine:
            if (piece.table, piece.shard_index) not in self.shard_keys:
                self.shard_keys.append((piece.table, piece.shard_index))
        self.piece_shard = [self.shard_keys.index((p.table, p.shard_index)) for p in mine]
        self.piece_cols = [p.cols for p in mine]
        self.shards: List[ShardMetadata] = [spec.module_plan[t].shards[k] for t, k in self.shard_keys]
        self.weights = nn.ParameterDict()
        self.kernel: Optional[BatchedEmbeddingKernel] = None
        if not self.shard_keys:
            return
        specs = [TableSpec(s.shard_sizes[0], s.shard_sizes[1], f"{t}__{k}") for (t, k), s in zip(self.shard_keys, self.shards)]
        # Kernel features are (source rank, feature shard) pairs. fbgemm's TBE needs the features of one table
        # next to each other, so the kernel sees them ordered by (shard, source, feature shard); the data arrives
        # ordered by (source, feature shard) and is permuted on the way in (ids) and out (results) when the
        # orders differ.
        W, n = env.world_size, len(mine)
        arrival = [(i, b) for i in range(W) for b in range(n)]
        kernel_order = sorted(range(len(arrival)), key=lambda a: (self.piece_shard[arrival[a][1]], a))
        self.permuted = kernel_order != list(range(len(arrival)))
        self.kernel_order = torch.tensor(kernel_order, dtype=torch.int64, device=env.device)
        kernel_cols = [self.piece_cols[arrival[a][1]] for a in kernel_order]
        self.kernel_cols, self.arrival_bags_order = kernel_cols, kernel_order
        starts = [0]
        for c in kernel_cols:
            starts.append(starts[-1] + c)
        position = {a: k for k, a in enumerate(kernel_order)}
        self.arrival_position = [position[a] for a in range(len(arrival))]
        back = [torch.arange(starts[position[a]], starts[position[a]] + kernel_cols[position[a]]) for a in range(len(arrival))]
        self.back_columns = torch.cat(back).to(env.device)
        self.kernel = make_batched_embedding(
            specs, feature_table_map=[self.piece_shard[arrival[a][1]] for a in kernel_order],
            pooling="sum" if spec.pooled else "none", optimizer=spec.optimizer, device=env.device,
            backend=spec.backend, dtype=spec.dtype, ids_out_of_range="unchecked",
            feature_names=[f"rank{arrival[a][0]}:{mine[arrival[a][1]].feature}" for a in kernel_order])
        with torch.no_grad():
            for (table, k), shard, param in zip(self.shard_keys, self.shards, self.kernel.table_weights):
                (r0, r1), (c0, c1) = shard.rows, shard.columns
                source = spec.initial_weights.get(table)
                if source is not None:
                    param.copy_(source[r0:r1, c0:c1])
                else:
                    spec.table(table).init_fn(param)
                self.weights[f"{table}__{k}"] = param
        if spec.optimizer is not None:
            for param in self.kernel.table_weights:
                param._in_backward_optimizers = ["fused"]  # skipped by in_backward_optimizer_filter

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        """Pooled: TRANSPOSED, [W * sum(shard cols), B], rows in (source rank, feature shard, column) order, so each
        source's block is contiguous and every later placement works on whole rows of B values (B: the
        largest source batch; a smaller source's block ends in zero columns, see pooled_to_requesters).
        Sequence: [ids received, cols] in arrival order."""
        B = received.padded_batch_size
        if self.kernel is None:
            shape = (0,) if received.variable_batch and self.pooled else (0, B) if self.pooled else (0, 0)
            return torch.zeros(shape, device=self.env.device, requires_grad=torch.is_grad_enabled())
        if received.variable_batch and self.pooled:
            return self.variable_batch_lookup(received)
        lengths, ids, weights = received.lengths, received.ids, received.weights
        # bags of fewer samples (smaller sources, VBE features) get empty bags at the end: no ids move
        lengths = pad_bags(lengths, [n for bags in received.bags for n in bags], B).reshape(-1)
        id_order = None
        if self.permuted and self.pooled and fbgemm_available():  # fbgemm's op does the same in one call
            lengths, ids, weights = torch.ops.fbgemm.permute_2D_sparse_data(
                self.kernel_order.int(), lengths.view(-1, B), ids, weights, ids.numel())
            lengths = lengths.reshape(-1)
        elif self.permuted:
            lengths, id_order = permute_segments(lengths.view(-1, B), self.kernel_order)
            ids = ids[id_order]
            weights = weights[id_order] if weights is not None else None
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        result = self.kernel(ids, offsets, weights)
        if self.pooled:
            # (a contiguous copy first: selecting rows of the transposed view reads memory with a stride)
            transposed = result.t().contiguous()
            return transposed.index_select(0, self.back_columns) if self.permuted else transposed
        if not self.permuted:
            return result
        inverse = torch.empty_like(id_order)
        inverse[id_order] = torch.arange(id_order.numel(), device=id_order.device)
        return result.index_select(0, inverse)

    def variable_batch_lookup(self, received: ReceivedIds) -> torch.Tensor:
        """Pooled, VBE: every (source rank, feature shard) at its own bags, nothing padded: FLAT, in (source rank,
        feature shard) order, each block [its bags, cols] row-major, so each source's blocks are contiguous and
        go back as they are (pooled_blocks_to_requesters). The kernel's variable-batch mode does the lookup."""
        bags = [n for per_source in received.bags for n in per_source]  # arrival order
        lengths, ids, weights = received.lengths.to(torch.int64), received.ids, received.weights
        kernel_bags = bags
        if self.permuted:  # whole segments (a feature shard's bags and ids) into the kernel's order
            bag_counts = torch.tensor(bags, dtype=torch.int64, device=lengths.device)
            value_ends = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
            torch.cumsum(lengths, 0, out=value_ends[1:])
            bag_ends = bag_counts.cumsum(0)
            ids_per_piece = value_ends[bag_ends] - value_ends[bag_ends - bag_counts]
            id_positions = segment_positions(ids_per_piece, self.kernel_order)
            lengths = lengths.index_select(0, segment_positions(bag_counts, self.kernel_order))
            ids = ids.index_select(0, id_positions)
            weights = weights.index_select(0, id_positions) if weights is not None else None
            kernel_bags = [bags[a] for a in self.arrival_bags_order]
        offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
        torch.cumsum(lengths, 0, out=offsets[1:])
        flat = self.kernel(ids, offsets, weights, batch_size_per_feature=kernel_bags)
        if not self.permuted:
            return flat
        return take_segments(flat, [n * c for n, c in zip(kernel_bags, self.kernel_cols)], self.arrival_position)

    def shard_memory_bytes(self) -> Dict[str, int]:
        """Bytes of this rank's shard weights and fused optimizer state."""
        if self.kernel is None:
            return {"weights": 0, "optimizer": 0}
        weights = sum(p.numel() * p.element_size() for p in self.kernel.table_weights)
        state = 0
        if self.kernel.optimizer is not None:
            state = sum(t.numel() * t.element_size() for s in self.kernel.split_optimizer_states() for t in s.values())
        return {"weights": weights, "optimizer": state}


def permute_segments(lengths: torch.Tensor, order: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reorder the rows of a [features, B] lengths table: (new flat lengths, positions of the values to take)."""
    return lengths[order].reshape(-1).to(torch.int64), segment_positions(lengths.sum(1), order)


# ------------------------------------------------------------------------------------------------ output_dist
def pooled_to_requesters(env: ShardingEnv, pooled: torch.Tensor, received: ReceivedIds,
                         cols_by_owner: Sequence[Sequence[int]], name: str = "output_dist", codecs=None) -> torch.Tensor:
    """Each owner sends rank i its pooled block of every feature shard (cols x the bags rank i sent it,
    transposed); returns [sum over owners of cols, B_me], the bags of shorter features zero at the end.

    `pooled` is the owner's transposed lookup, [W * cols, max B_i] with rows in (source, feature shard, column)
    order; `cols_by_owner[o]` the width of each feature shard of owner o. Only a feature shard's own bags
    travel (received.bags: a source's batch size, or with VBE its feature's); with equal batch sizes the send
    buffer is `pooled` itself. `codecs`: the wire precisions (comm.all_to_all_with_grad).
    """
    W, me = env.world_size, env.rank
    mine = cols_by_owner[me]
    send = to_ragged(pooled, list(mine) * W, [n for bags in received.bags for n in bags])
    send_numels = [sum(c * n for c, n in zip(mine, bags)) for bags in received.bags]
    receive_numels = [sum(c * n for c, n in zip(cols, bags)) for cols, bags in zip(cols_by_owner, received.bags_sent)]
    block = all_to_all_with_grad(env, send, send_numels, receive_numels, name, codecs)
    return from_ragged(block, [c for cols in cols_by_owner for c in cols],
                       [n for bags in received.bags_sent for n in bags], received.batch_size)


@dataclass(frozen=True)
class PooledBlocks:
    """Where the flat pooled rows of a VBE output_dist go: block k of the flat buffer is [bags[k], cols[k]]
    row-major, columns col_starts[k] .. + cols[k] of output key keys[k] (the collection expands it with the
    inverse indices of that key's feature: rectoolkit.modules.layout.expand_blocks)."""

    keys: List[str]
    col_starts: List[int]
    cols: List[int]
    bags: List[int]


def pooled_blocks_to_requesters(env: ShardingEnv, flat: torch.Tensor, received: ReceivedIds,
                                by_owner: Sequence[Sequence[FeatureShard]],
                                name: str = "output_dist", codecs=None) -> Tuple[torch.Tensor, PooledBlocks]:
    """output_dist of a VBE lookup (LocalShards.variable_batch_lookup): each source's blocks go back as they lie
    in `flat` (no copy, no padding): the same bytes as pooled_to_requesters, in rows instead of columns.
    Returns the received flat buffer, in (owner, feature shard) order, and where its blocks go."""
    mine = [p.cols for p in by_owner[env.rank]]
    send_numels = [sum(c * n for c, n in zip(mine, bags)) for bags in received.bags]
    receive_numels = [sum(p.cols * n for p, n in zip(pieces, bags)) for pieces, bags in zip(by_owner, received.bags_sent)]
    block = all_to_all_with_grad(env, flat, send_numels, receive_numels, name, codecs)
    pieces = [p for owned in by_owner for p in owned]
    return block, PooledBlocks([p.output_key for p in pieces], [p.col_start for p in pieces],
                               [p.cols for p in pieces], [n for bags in received.bags_sent for n in bags])


def output_columns(by_owner: Sequence[Sequence[FeatureShard]], key_offsets: Mapping[str, int]) -> torch.Tensor:
    """Output column of every received row, in the (owner, feature shard, column) order pooled_to_requesters
    returns."""
    columns = [torch.arange(key_offsets[p.output_key] + p.col_start, key_offsets[p.output_key] + p.col_end)
               for pieces in by_owner for p in pieces]
    return torch.cat(columns) if columns else torch.empty(0, dtype=torch.int64)  # moved to the device by the caller
