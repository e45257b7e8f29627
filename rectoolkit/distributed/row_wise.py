"""ROW_WISE: a table is cut into contiguous row blocks, one per rank.

    input_dist    the ids of feature f are bucketed by row block; bucket k -> rank k     (all-to-all)
                  (ids arrive shifted to the block: id - row_start)
    lookup        each rank pools the ids that fall in its block: a partial sum per sample
    output_dist   each rank sends rank i its [B, dim] partial sums; rank i adds them up    (all-to-all + sum:
                  a reduce-scatter, written so that gloo, which has none, runs it)

Bytes (rectoolkit.plan.traffic): rank i sends block k's owner 4 B_i + 8 * (ids in block k); every owner
returns 4 * B_i * dim.
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.distributed.bags import FeatureBatch, ReceivedIds, ids_to_owners, pooled_to_requesters
from rectoolkit.distributed.group import EmbeddingShardingGroup, require
from rectoolkit.plan.types import ShardingType


class RowWiseSharding(EmbeddingShardingGroup):
    """The ROW_WISE tables of one sharded collection."""

    sharding_type = ShardingType.ROW_WISE

    def check_table_plan(self, table, ps) -> None:
        require(all(s.columns == (0, table.embedding_dim) for s in ps.shards), table, ps,
                "a row block does not hold all columns (use GRID_SHARD to cut columns too)")

    def input_dist(self, batch: FeatureBatch) -> ReceivedIds:
        return ids_to_owners(self.env, batch, self.bags_by_owner, self.weighted, self.keep_positions())

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        return self.local.lookup(received)

    def output_dist(self, looked_up: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.pooled:
            return self.sequence_output_dist(looked_up, received)
        partial_sums = pooled_to_requesters(self.env, looked_up, received.batch_sizes, self.cols_by_owner)
        return partial_sums, self.out_columns  # every block targets the same columns: they are summed
