"""ROW_WISE: a table is cut into contiguous row blocks, one per rank.

    input_dist    the ids of feature f are bucketed by row block; bucket k -> rank k     (all-to-all)
                  (ids arrive shifted to the block: id - row_start)
    lookup        each rank pools the ids that fall in its block: a partial sum per sample
    output_dist   each rank sends rank i its [B, dim] partial sums; rank i adds them up    (all-to-all + sum:
                  a reduce-scatter, written so that gloo, which has none, runs it)

Every row block's partial sums target the same output columns, so the collection's `index_add` adds them up.
Bytes (rectoolkit.plan.traffic): rank i sends block k's owner 4 B_i + 8 * (ids in block k); every owner
returns 4 * B_i * dim. With a batch size per feature (VBE), S_i(f) in place of B_i, plus a 4-byte count per
feature shard.
"""

from __future__ import annotations

import torch

from rectoolkit.distributed.feature_shards import FeatureBatch, FeatureShard, RoutedIds
from rectoolkit.distributed.group import RoutedShardingGroup, require
from rectoolkit.distributed.table_wise import every_id
from rectoolkit.plan.types import ShardingType


def bucket_by_rows(batch: FeatureBatch, shard: FeatureShard) -> RoutedIds:
    """Routing of a row block: the ids of the feature in [row_start, row_end), shifted to the block's rows,
    with each sample's count of them (its lengths) and where they sit (for sequence outputs)."""
    if shard.full_rows:
        return every_id(batch, shard)

    def bucket() -> RoutedIds:
        ids, weights = batch.values[shard.feature], batch.weights[shard.feature]
        if shard.row_start == 0:  # (the first and last blocks need one comparison)
            keep = ids < shard.row_end
        elif shard.row_end >= shard.table_rows:
            keep = ids >= shard.row_start
        else:
            keep = (ids >= shard.row_start) & (ids < shard.row_end)
        kept_before = torch.zeros(ids.numel() + 1, dtype=torch.int64, device=ids.device)
        torch.cumsum(keep, 0, out=kept_before[1:])
        positions = keep.nonzero().view(-1)
        return RoutedIds(kept_before.index_select(0, batch.offsets(shard.feature)).diff(), ids[positions] - shard.row_start,
                         weights[positions] if weights is not None else None,
                         positions + batch.value_starts[shard.feature])

    return batch.cached((shard.feature, shard.row_start, shard.row_end), bucket)


class RowWiseSharding(RoutedShardingGroup):
    """The ROW_WISE tables of one sharded collection (output: the base's one level; partial sums added)."""

    sharding_type = ShardingType.ROW_WISE

    def check_table_plan(self, table, ps) -> None:
        require(all(s.columns == (0, table.embedding_dim) for s in ps.shards), table, ps,
                "a row block does not hold all columns (use GRID_SHARD to cut columns too)")

    def route(self, batch: FeatureBatch, shard: FeatureShard) -> RoutedIds:
        return bucket_by_rows(batch, shard)
