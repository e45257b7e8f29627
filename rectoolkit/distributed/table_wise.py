"""TABLE_WISE: every table lives whole on one rank.

    input_dist    every id of feature f  ->  the rank that owns f's table        (all-to-all)
    lookup        the owner pools its tables for the samples of every rank
    output_dist   the owner sends each rank its [B, dim] pooled rows back         (all-to-all)

Bytes (rectoolkit.plan.traffic): rank i sends the owner 4 B_i + 8 * ids; the owner returns 4 * B_i * dim.
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.distributed.bags import FeatureBatch, ReceivedIds, ids_to_owners, pooled_to_requesters
from rectoolkit.distributed.group import EmbeddingShardingGroup, require
from rectoolkit.plan.types import ShardingType


class TableWiseSharding(EmbeddingShardingGroup):
    """The TABLE_WISE tables of one sharded collection."""

    sharding_type = ShardingType.TABLE_WISE

    def check_table_plan(self, table, ps) -> None:
        require(len(ps.shards) == 1, table, ps, "it has more than one shard (use COLUMN_WISE or ROW_WISE)")

    def input_dist(self, batch: FeatureBatch) -> ReceivedIds:
        return ids_to_owners(self.env, batch, self.bags_by_owner, self.weighted, self.keep_positions())

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        return self.local.lookup(received)

    def output_dist(self, looked_up: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.pooled:
            return self.sequence_output_dist(looked_up, received)
        pooled = pooled_to_requesters(self.env, looked_up, received.batch_sizes, self.cols_by_owner)
        return pooled, self.out_columns  # each table's columns once: placing them is concatenating
