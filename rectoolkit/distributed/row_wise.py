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

import itertools
from typing import List, Optional, Sequence, Tuple

import torch

from rectoolkit.distributed.fbgemm_qcomm_codec import CommOp
from rectoolkit.distributed.feature_shards import FeatureBatch, FeatureShard, RoutedIds
from rectoolkit.distributed.group import RoutedShardingGroup, require
from rectoolkit.distributed.table_wise import every_id
from rectoolkit.plan.types import ShardingType


def bucket_by_rows(batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]],
                   positions: bool = True) -> List[List[RoutedIds]]:
    """Routing of row blocks: for each feature shard, the ids of its feature in [row_start, row_end), shifted to
    the block's rows, with each sample's count of them (its lengths) [and where they sit in the collection's
    values: `positions`, for sequence outputs]. A shard of all rows gets every id; the other blocks are routed all
    at once (block_ids), each once per batch."""
    blocks = [[(s.feature, s.row_start, s.row_end, positions) for s in shards if not s.full_rows] for shards in by_owner]
    routed = iter(batch.cached([block for owner in blocks for block in owner], lambda todo: block_ids(batch, todo)))
    return [[every_id(batch, s) if s.full_rows else next(routed) for s in shards] for shards in by_owner]


def block_ids(batch: FeatureBatch, blocks: Sequence[Tuple[str, int, int, bool]]) -> List[RoutedIds]:
    """The RoutedIds of each (feature, row_start, row_end, with positions) block, in one pass over the blocks'
    features' ids laid back to back (a few tensor ops for all blocks: one block at a time took about 50 us of op overhead each, 2.7 ms
    per step for 26 row-wise tables on 2 ranks)."""
    if not blocks:
        return []
    features = [block[0] for block in blocks]
    values = [batch.values[f] for f in features]
    device = values[0].device
    counts = [v.numel() for v in values]
    total = sum(counts)
    per_id = torch.tensor(counts, device=device)
    lo = torch.tensor([block[1] for block in blocks], device=device).repeat_interleave(per_id, output_size=total)
    hi = torch.tensor([block[2] for block in blocks], device=device).repeat_interleave(per_id, output_size=total)
    ids = torch.cat(values)
    keep = (ids >= lo) & (ids < hi)
    kept_before = torch.zeros(total + 1, dtype=torch.int64, device=device)
    torch.cumsum(keep, 0, out=kept_before[1:])
    lengths = torch.stack([batch.lengths[f] for f in features])  # [blocks, B]: every feature has B bags (VBE: padded)
    bag_ends = torch.cumsum(lengths.view(-1), 0)  # the features' ids are back to back, each its B bags' worth
    kept = kept_before.index_select(0, bag_ends).diff(prepend=kept_before[:1]).view(lengths.shape)
    kept_per_block = kept.sum(1).tolist()
    routed_ids = (ids - lo).masked_select(keep).split(kept_per_block)
    where: Sequence[Optional[torch.Tensor]] = [None] * len(blocks)
    if any(block[3] for block in blocks):  # where each kept id sits in the collection's values: its place among
        block_starts = itertools.accumulate(counts[:-1], initial=0)  # the blocks' ids, moved to its feature's
        shift = torch.tensor([batch.value_starts[f] - start for f, start in zip(features, block_starts)], device=device)
        place = torch.arange(total, device=device) + shift.repeat_interleave(per_id, output_size=total)
        where = place.masked_select(keep).split(kept_per_block)
    weights = [batch.weights[f] for f in features]
    kept_weights = torch.cat(weights).masked_select(keep).split(kept_per_block) if weights[0] is not None \
        else [None] * len(blocks)
    return [RoutedIds(*parts) for parts in zip(kept.unbind(0), routed_ids, kept_weights, where)]


class RowWiseSharding(RoutedShardingGroup):
    """The ROW_WISE tables of one sharded collection (output: the base's one level; partial sums added)."""

    sharding_type = ShardingType.ROW_WISE
    output_comm_op = CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER  # (an all-to-all + sum here)

    def check_table_plan(self, table, ps) -> None:
        require(all(s.columns == (0, table.embedding_dim) for s in ps.shards), table, ps,
                "a row block does not hold all columns (use GRID_SHARD to cut columns too)")

    def route(self, batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]]) -> List[List[RoutedIds]]:
        return bucket_by_rows(batch, by_owner, positions=not self.pooled)  # (sequence outputs place each id)
