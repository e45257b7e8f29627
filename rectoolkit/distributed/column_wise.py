"""COLUMN_WISE: a table is cut into column blocks, each block placed like a table of its own.

    input_dist    every id of feature f  ->  the owner of each column block (once per block)   (all-to-all)
    lookup        each owner pools its blocks for the samples of every rank
    output_dist   each owner sends each rank its [B, block cols] pooled block back              (all-to-all)
                  and the receiver puts the blocks side by side: [B, dim]

Bytes (rectoolkit.plan.traffic): per block, rank i sends its owner 4 B_i + 8 * ids (blocks on one rank are
still sent separately), and the owner returns 4 * B_i * block cols.
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.distributed.bags import FeatureBatch, ReceivedIds, ids_to_owners, pooled_to_requesters
from rectoolkit.distributed.group import EmbeddingShardingGroup, require
from rectoolkit.plan.types import ShardingType


class ColumnWiseSharding(EmbeddingShardingGroup):
    """The COLUMN_WISE tables of one sharded collection."""

    sharding_type = ShardingType.COLUMN_WISE

    def check_table_plan(self, table, ps) -> None:
        require(all(s.rows == (0, table.num_embeddings) for s in ps.shards), table, ps,
                "a column block does not hold all rows (use GRID_SHARD to cut rows too)")

    def input_dist(self, batch: FeatureBatch) -> ReceivedIds:
        return ids_to_owners(self.env, batch, self.bags_by_owner, self.weighted, self.keep_positions())

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        return self.local.lookup(received)

    def output_dist(self, looked_up: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.pooled:
            return self.sequence_output_dist(looked_up, received)
        pooled = pooled_to_requesters(self.env, looked_up, received.batch_sizes, self.cols_by_owner)
        return pooled, self.out_columns  # block k lands in columns [col_start, col_end) of its feature
