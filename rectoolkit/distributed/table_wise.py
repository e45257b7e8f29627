"""TABLE_WISE: every table lives whole on one rank.

    input_dist    every id of feature f  ->  the rank that owns f's table        (all-to-all)
    lookup        the owner pools its tables for the samples of every rank
    output_dist   the owner sends each rank its [B, dim] pooled rows back         (all-to-all)

Bytes (rectoolkit.plan.traffic): rank i sends the owner 4 B_i + 8 * ids; the owner returns 4 * B_i * dim.
With a batch size per feature (VBE), S_i(f) in place of B_i, plus a 4-byte count per feature shard.
"""

from __future__ import annotations

from typing import List, Sequence

from rectoolkit.distributed.feature_shards import FeatureBatch, FeatureShard, RoutedIds
from rectoolkit.distributed.group import RoutedShardingGroup, require
from rectoolkit.plan.types import ShardingType


def every_id(batch: FeatureBatch, shard: FeatureShard) -> RoutedIds:
    """Routing of a shard that holds all rows: every id of the feature, as it is."""
    feature = shard.feature
    return RoutedIds(batch.lengths[feature], batch.values[feature], batch.weights[feature], None)


class TableWiseSharding(RoutedShardingGroup):
    """The TABLE_WISE tables of one sharded collection (output: the one-level all-to-all of the base)."""

    sharding_type = ShardingType.TABLE_WISE

    def check_table_plan(self, table, ps) -> None:
        require(len(ps.shards) == 1, table, ps, "it has more than one shard (use COLUMN_WISE or ROW_WISE)")

    def route(self, batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]]) -> List[List[RoutedIds]]:
        return [[every_id(batch, shard) for shard in shards] for shards in by_owner]  # a shard gets the whole feature
