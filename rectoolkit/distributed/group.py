"""What the six sharding types share: the tables of one type in one sharded collection, run in three steps.

    group(batch)  =  output_dist(lookup(input_dist(batch)))  ->  (block, where)

`block` holds this rank's results and `where` their places in the collection's output: for pooled outputs
`block` is [n, B] (transposed: one row per output column, so placing and its gradient move whole rows) and
`where` the n output columns (columns that repeat are summed: that is how row-wise partial sums are reduced); for sequence outputs `block` is flat and `where` the flat positions in the
[ids, dim] output. The collection adds every group's block into one zero tensor (`index_add`), so the
gradient of each block is simply the output gradient read back at `where`.

Each sharding type (table_wise.py, row_wise.py, ...) is a subclass that writes its three steps.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import nn

from rectoolkit.distributed.bags import (
    Bag,
    FeatureBatch,
    LocalShards,
    ReceivedIds,
    make_bags,
    output_columns,
)
from rectoolkit.distributed.comm import ShardingEnv, all_to_all_with_grad
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig
from rectoolkit.modules.configs import BaseEmbeddingConfig
from rectoolkit.plan.types import ParameterSharding, ShardingType, ShardMetadata


class EmbeddingShardingGroup(nn.Module):
    """Base of the per-type modules: bags, local shards, and the sequence output_dist they all share."""

    sharding_type: ShardingType

    def __init__(self, env: ShardingEnv, tables: Sequence[BaseEmbeddingConfig], output_keys: Sequence[Sequence[str]],
                 module_plan: Mapping[str, ParameterSharding], key_offsets: Mapping[str, int], pooled: bool,
                 weighted: bool, optimizer: Optional[FusedOptimizerConfig],
                 initial_weights: Mapping[str, torch.Tensor], backend: str = "auto",
                 dtype: torch.dtype = torch.float32, embedding_dim: int = 0) -> None:
        super().__init__()
        self.env = env
        self.tables = list(tables)
        self.pooled = pooled
        self.weighted = weighted
        self.embedding_dim = embedding_dim  # sequence outputs: the collection's one dim
        for table in self.tables:
            self.check_table_plan(table, module_plan[table.name])
        self.module_plan = {t.name: module_plan[t.name] for t in self.tables}
        self.bags_by_owner: List[List[Bag]] = make_bags(self.tables, output_keys, module_plan, env.world_size)
        self.cols_by_owner = [sum(b.cols for b in bags) for bags in self.bags_by_owner]
        my_bags = self.bags_by_owner[env.rank]
        if not pooled and len({b.cols for b in my_bags}) > 1:
            raise ValueError(f"rank {env.rank} holds column shards of widths {sorted({b.cols for b in my_bags})} of "
                             "an EmbeddingCollection; give the column shards one width (or place them on other ranks)")
        self.local = LocalShards(env, my_bags, {t.name: t for t in self.tables}, module_plan, pooled, optimizer,
                                 initial_weights, backend, dtype)
        self.register_buffer("out_columns", output_columns(self.bags_by_owner, key_offsets).to(env.device),
                             persistent=False)

    # -------------------------------------------------------------- the three steps (written per type)
    def check_table_plan(self, table: BaseEmbeddingConfig, ps: ParameterSharding) -> None:
        """Raise if the table's shards do not have this type's shape."""

    def input_dist(self, batch: FeatureBatch) -> ReceivedIds:
        raise NotImplementedError

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        raise NotImplementedError

    def output_dist(self, looked_up: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, batch: FeatureBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        received = self.input_dist(batch)
        looked_up = self.lookup(received)
        return self.output_dist(looked_up, received)

    # -------------------------------------------------------------- shared by every type
    def sequence_output_dist(self, rows: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        """output_dist of an EmbeddingCollection: each id's row slice goes back to the rank that sent the id."""
        W, me = self.env.world_size, self.env.rank
        width = [bags[0].cols if bags else 0 for bags in self.bags_by_owner]
        send_splits = [n * width[me] for n in received.ids_received]
        receive_splits = [sum(received.ids_sent[owner]) * width[owner] for owner in range(W)]
        block = all_to_all_with_grad(self.env, rows.reshape(-1), send_splits, receive_splits, "output_dist")
        D = self.embedding_dim
        where = []
        for owner in range(W):
            for bag, positions in zip(self.bags_by_owner[owner], received.positions_sent[owner]):
                columns = torch.arange(bag.col_start, bag.col_end, device=positions.device)
                where.append((positions.unsqueeze(1) * D + columns).reshape(-1))
        where = torch.cat(where) if where else torch.empty(0, dtype=torch.int64)
        return block, where.to(self.env.device)

    def keep_positions(self) -> bool:
        return not self.pooled

    def local_shards(self) -> List[Tuple[str, ShardMetadata, torch.Tensor, Dict[str, torch.Tensor]]]:
        """(table, shard, weight, optimizer state) of every shard this rank holds."""
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
