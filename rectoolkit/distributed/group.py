"""What the seven sharding types share: the tables of one type in one sharded collection, run in three steps.

    group(batch)  =  output_dist(lookup(input_dist(batch)))  ->  (block, where)

`block` holds this rank's results and `where` their places in the collection's output: for pooled outputs
`block` is [n, B] (transposed: one row per output column, so placing and its gradient move whole rows) and
`where` the n output columns (columns that repeat are summed: that is how row-wise partial sums are reduced);
for sequence outputs `block` is flat and `where` the flat positions in the [ids, dim] output. The collection
adds every group's block into one zero tensor (`index_add`), so the gradient of each block is simply the output
gradient read back at `where`.

`ShardingGroup` is the interface (data_parallel.py implements it directly). `RoutedShardingGroup` is the base
of the five types that move ids to the shards' owners; it holds the steps they share, written once:

    input_dist   ids_to_owners(), with the ids each feature shard gets chosen by the type's `route`
    lookup       LocalShards.lookup(): this rank's shards in one batched kernel
    output_dist  pooled results straight back to the ranks that asked (one all-to-all); sequence results
                 (EmbeddingCollection) always go back this way; in the precision of the registry's codecs for
                 the type's `output_comm_op` (SEQUENCE_EMBEDDINGS_ALL_TO_ALL for sequence results)

A sharding type module (table_wise.py, row_wise.py, ...) says only what differs: its plan shape
(`check_table_plan`), its routing (`route`) and, for the two-level types, its output combination.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from rectoolkit.distributed.awaitable import Ready
from rectoolkit.distributed.comm import ShardingEnv, all_to_all_with_grad
from rectoolkit.distributed.fbgemm_qcomm_codec import CommOp, codecs_for
from rectoolkit.distributed.feature_shards import (
    FeatureBatch,
    FeatureShard,
    LocalShards,
    ReceivedIds,
    RoutedIds,
    ShardingGroupSpec,
    make_feature_shards,
    output_columns,
    pooled_blocks_to_requesters,
    pooled_to_requesters,
    start_ids_to_owners,
)
from rectoolkit.modules.configs import BaseEmbeddingConfig
from rectoolkit.plan.types import ParameterSharding, ShardingType, ShardMetadata

__all__ = ["RoutedShardingGroup", "ShardingGroup", "ShardingGroupSpec", "require"]

LocalShard = Tuple[str, ShardMetadata, torch.Tensor, Dict[str, torch.Tensor]]


class ShardingGroup(nn.Module):
    """The interface of a sharding type: plan check, three steps, and the shards this rank holds."""

    sharding_type: ShardingType

    def __init__(self, spec: ShardingGroupSpec) -> None:
        super().__init__()
        self.env = spec.env
        self.tables = spec.tables
        self.pooled = spec.pooled
        self.weighted = spec.weighted
        self.module_plan = spec.module_plan
        for table in self.tables:
            self.check_table_plan(table, spec.module_plan[table.name])

    def check_table_plan(self, table: BaseEmbeddingConfig, ps: ParameterSharding) -> None:
        """Raise if the table's shards do not have this type's shape."""

    def input_dist(self, batch: FeatureBatch):
        raise NotImplementedError

    def start_input_dist(self, batch: FeatureBatch, env: Optional[ShardingEnv] = None):
        """input_dist in two stages on `env` (default: the group's), for the train pipeline: `wait()` of the
        result starts the second stage and returns it, whose `wait()` gives what input_dist returns. Here it
        runs at once (a type that sends nothing); the routed types start their "metadata" all-to-all, then
        their ids' all-to-all (feature_shards.start_ids_to_owners)."""
        return Ready(Ready(self.input_dist(batch)))

    def lookup(self, received) -> torch.Tensor:
        raise NotImplementedError

    def output_dist(self, looked_up: torch.Tensor, received) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, batch: FeatureBatch, received=None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The three steps; `received`: input_dist's result when it already ran (the train pipeline)."""
        if received is None:
            received = self.input_dist(batch)
        return self.output_dist(self.lookup(received), received)

    def local_shards(self) -> List[LocalShard]:
        """(table, shard, weight, optimizer state) of every shard this rank holds."""
        raise NotImplementedError

    def shard_memory_bytes(self) -> Dict[str, int]:
        raise NotImplementedError

    def set_learning_rate(self, lr: float) -> None:
        """Change the lr of the optimizer fused into this group's shards (their kernel's; none: nothing to change)."""
        kernel = getattr(getattr(self, "local", None), "kernel", None)
        if kernel is not None and kernel.optimizer is not None:
            kernel.set_learning_rate(float(lr))

    def set_optimizer_step(self, step: int) -> None:
        """Set the fused optimizer's step count (Adam's bias correction reads it): fbgemm's TBE by its own
        set_optimizer_step, as TorchRec calls it; the torch kernel's count of updates."""
        kernel = getattr(getattr(self, "local", None), "kernel", None)
        if kernel is None or kernel.optimizer is None:
            return
        if hasattr(kernel, "tbe"):
            kernel.tbe.set_optimizer_step(int(step))
        else:
            kernel.num_updates = int(step)


class RoutedShardingGroup(ShardingGroup):
    """Base of the types whose ids travel to the shards' owners (all but DATA_PARALLEL).

    A batch with a batch size per feature (VBE) sends each feature shard only its feature's own bags and gets its
    pooled rows back at that batch size (start_ids_to_owners' `bags_per_feature`). One level: the owner's kernel
    runs every feature shard at its own bags and the rows travel flat, with a PooledBlocks saying where they go;
    the two-level types also tell their gateways each feature's batch size (`gateway_keys`, set by
    table_row_wise.py) and pad at the owner."""

    gateway_keys: Optional[List[List[Tuple[str, str]]]] = None  # per host: (output key, feature) its gateways reduce
    output_comm_op = CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL  # TorchRec's registry entry for the pooled output_dist

    def __init__(self, spec: ShardingGroupSpec) -> None:
        super().__init__(spec)
        self.embedding_dim = spec.embedding_dim
        self.by_owner: List[List[FeatureShard]] = make_feature_shards(
            self.tables, spec.output_keys, spec.module_plan, self.env.world_size)
        self.cols_by_owner = [sum(p.cols for p in pieces) for pieces in self.by_owner]
        self.piece_cols_by_owner = [[p.cols for p in pieces] for pieces in self.by_owner]
        mine = self.by_owner[self.env.rank]
        if not self.pooled and len({p.cols for p in mine}) > 1:
            raise ValueError(f"rank {self.env.rank} holds column shards of widths {sorted({p.cols for p in mine})} "
                             "of an EmbeddingCollection; give the column shards one width (or place them on other "
                             "ranks)")
        self.local = LocalShards(spec, mine)
        self.output_codecs = codecs_for(spec.qcomm_codecs_registry, self.output_comm_op if self.pooled
                                        else CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL)
        self.register_buffer("out_columns", output_columns(self.by_owner, spec.key_offsets).to(self.env.device),
                             persistent=False)

    def route(self, batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]]) -> List[List[RoutedIds]]:
        """For every owner's feature shards, the ids of the shard's feature that go to it (written by each type)."""
        raise NotImplementedError

    # -------------------------------------------------------------- the three steps
    def input_dist(self, batch: FeatureBatch) -> ReceivedIds:
        return self.start_input_dist(batch).wait().wait()

    def start_input_dist(self, batch: FeatureBatch, env: Optional[ShardingEnv] = None):
        return start_ids_to_owners(env or self.env, batch, self.by_owner, self.route, self.weighted,
                                   keep_positions=not self.pooled, bags_per_feature=self.pooled,
                                   gateway_keys=self.gateway_keys)

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        return self.local.lookup(received)

    def output_dist(self, looked_up: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.pooled:
            return self.sequence_output_dist(looked_up, received)
        return self.pooled_output_dist(looked_up, received)

    def pooled_output_dist(self, pooled: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        """One level: each owner sends every rank its [B_i, cols] block (VBE: each feature's own bags); the blocks
        land at their output columns (column blocks side by side; row blocks on the same columns, so the
        collection sums the partial sums). VBE: each feature's own pooled rows, flat, and where they go."""
        if received.variable_batch:
            return pooled_blocks_to_requesters(self.env, pooled, received, self.by_owner, codecs=self.output_codecs)
        return pooled_to_requesters(self.env, pooled, received, self.piece_cols_by_owner,
                                    codecs=self.output_codecs), self.out_columns

    def sequence_output_dist(self, rows: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        """output_dist of an EmbeddingCollection: each id's row slice goes back to the rank that sent the id."""
        W, me = self.env.world_size, self.env.rank
        width = [pieces[0].cols if pieces else 0 for pieces in self.by_owner]
        send_splits = [n * width[me] for n in received.ids_received]
        receive_splits = [sum(received.ids_sent[owner]) * width[owner] for owner in range(W)]
        block = all_to_all_with_grad(self.env, rows.reshape(-1), send_splits, receive_splits, "output_dist",
                                     self.output_codecs)
        D = self.embedding_dim
        where = []
        for owner in range(W):
            for piece, positions in zip(self.by_owner[owner], received.positions_sent[owner]):
                columns = torch.arange(piece.col_start, piece.col_end, device=positions.device)
                where.append((positions.unsqueeze(1) * D + columns).reshape(-1))
        where = torch.cat(where) if where else torch.empty(0, dtype=torch.int64)
        return block, where.to(self.env.device)

    # -------------------------------------------------------------- state
    def local_shards(self) -> List[LocalShard]:
        kernel = self.local.kernel
        if kernel is None:
            return []
        states = kernel.split_optimizer_states() if kernel.optimizer is not None else [{} for _ in kernel.tables]
        return [(table, shard, weight, state) for (table, _), shard, weight, state
                in zip(self.local.shard_keys, self.local.shards, kernel.table_weights, states)]

    def shard_memory_bytes(self) -> Dict[str, int]:
        return self.local.shard_memory_bytes()


def require(condition: bool, table: BaseEmbeddingConfig, ps: ParameterSharding, what: str) -> None:
    if not condition:
        raise ValueError(f"table {table.name!r} is planned {ps.sharding_type} but {what}; "
                         f"its shards are {[(s.shard_offsets, s.shard_sizes, s.placement) for s in ps.shards]}")
