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
from typing import Dict, List, Optional, Sequence, Tuple

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
    """The RoutedIds of each (feature, row_start, row_end, with positions) block. Many ids on CPU: each id of a
    block's feature gets the number of the block that holds its row (a comparison per block edge, or a search where
    blocks leave gaps), and a stable sort of those numbers puts each block's ids together in their order, a few passes
    over the ids whatever the number of blocks (16 row-wise tables on 2 ranks, 268k ids: 3-4 ms, where a mask per
    block took 15 ms, 20 ms with 8 blocks a table); blocks of one feature that overlap (rows routed twice) are
    numbered in separate passes. Few ids, or on a GPU: a mask per block (_masked_block_ids)."""
    if not blocks:
        return []
    if sum(batch.values[block[0]].numel() for block in blocks) <= _MASKED_IDS \
            or batch.values[blocks[0][0]].device.type != "cpu":
        return _masked_block_ids(batch, blocks)
    routed: List[Optional[RoutedIds]] = [None] * len(blocks)
    positions = any(block[3] for block in blocks)
    for layer in _disjoint_layers(blocks):
        for k, ids in zip(layer, _disjoint_block_ids(batch, [blocks[k] for k in layer], positions)):
            routed[k] = ids
    return routed  # type: ignore[return-value]


# up to this many ids summed over blocks (each block's feature's), a mask per block beats numbering and sorting (its
# op count is fixed, about 0.35 ms for 26 features of 64 bags on 2 blocks; 2x slower than numbering at 66k)
_MASKED_IDS = 32768


def _masked_block_ids(batch: FeatureBatch, blocks: Sequence[Tuple[str, int, int, bool]]) -> List[RoutedIds]:
    """block_ids by a mask of each block over its feature's ids, all blocks in a few tensor ops (few ids, or on a
    GPU: one block at a time, about 50 us of op overhead each, took 2.7 ms per step for 26 row-wise tables on 2
    ranks)."""
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


def _disjoint_layers(blocks: Sequence[Tuple[str, int, int, bool]]) -> List[List[int]]:
    """The blocks' indices in groups whose blocks of one feature do not overlap (one group unless rows repeat),
    each group in order of feature and first row."""
    order = sorted(range(len(blocks)), key=lambda i: blocks[i][:3])
    if all(a[0] != b[0] or a[2] <= b[1] or a[1] == a[2] for a, b in zip((blocks[i] for i in order),
                                                                         (blocks[i] for i in order[1:]))):
        return [order]
    layers: List[List[int]] = []
    ends: List[Dict[str, int]] = []  # per group: feature -> end of its last block there
    for k in order:
        feature, start, end, _ = blocks[k]
        layer = next((i for i, last in enumerate(ends) if last.get(feature, start) <= start), len(layers))
        if layer == len(layers):
            layers.append([]), ends.append({})
        layers[layer].append(k)
        ends[layer][feature] = max(end, start)
    return layers


def _disjoint_block_ids(batch: FeatureBatch, blocks: Sequence[Tuple[str, int, int, bool]],
                        positions: bool) -> List[RoutedIds]:
    """block_ids of blocks sorted by (feature, first row) that do not overlap within a feature: block k's ids are
    those numbered k, ids in no block -1."""
    features = list(dict.fromkeys(block[0] for block in blocks))
    values = [batch.values[f] for f in features]
    device = values[0].device
    counts = [v.numel() for v in values]
    total = sum(counts)
    ids = torch.cat(values)
    per_feature = [[(start, end) for _, start, end, _ in mine] for _, mine in itertools.groupby(blocks, lambda b: b[0])]
    dtype = torch.int16 if len(blocks) < 2 ** 15 else torch.int32  # (a small number sorts fastest)
    number = torch.empty(total, dtype=dtype, device=device)
    first, at = 0, 0
    for feature_ids, mine in zip(values, per_feature):
        _number_ids(feature_ids, mine, first, number[at:at + feature_ids.numel()])
        first, at = first + len(mine), at + feature_ids.numel()
    sorted_number, order = torch.sort(number, stable=True)  # every block's ids together, in their order
    firsts = torch.searchsorted(sorted_number, torch.arange(-1, len(blocks) + 1, dtype=number.dtype, device=device))
    edges = firsts.tolist()
    kept_per_block = [b - a for a, b in zip(edges[1:], edges[2:])]
    order = order[edges[1]:]  # (ids in no block first)
    routed_ids = ids.index_select(0, order).split(kept_per_block)
    for block_ids_, (_, start, _, _) in zip(routed_ids, blocks):
        if start:
            block_ids_.sub_(start)  # relative to the block's first row (in place: one pass in all)
    lengths = torch.stack([batch.lengths[f] for f in features])  # [features, B]: B bags each (VBE: padded)
    B = lengths.shape[1]
    bag = torch.arange(B, dtype=torch.int32, device=device).repeat(len(features)).repeat_interleave(
        lengths.view(-1), output_size=total)
    key = number.to(torch.int32, copy=True).add_(1).mul_(B).add_(bag)  # (block + 1, bag): ids in no block first
    kept = torch.bincount(key, minlength=(len(blocks) + 1) * B)[B:].view(len(blocks), B)
    where: Sequence[Optional[torch.Tensor]] = [None] * len(blocks)
    if positions:  # where each kept id sits in the collection's values: its place among the features' ids, moved
        feature_starts = itertools.accumulate(counts[:-1], initial=0)  # to its feature's start there
        shift = torch.tensor([batch.value_starts[f] - start for f, start in zip(features, feature_starts)],
                             device=device)
        place = torch.arange(total, device=device) + shift.repeat_interleave(torch.tensor(counts, device=device),
                                                                             output_size=total)
        where = place.index_select(0, order).split(kept_per_block)
    weights = [batch.weights[f] for f in features]
    kept_weights = torch.cat(weights).index_select(0, order).split(kept_per_block) if weights[0] is not None \
        else [None] * len(blocks)
    return [RoutedIds(*parts) for parts in zip(kept.unbind(0), routed_ids, kept_weights, where)]


_COMPARED_BLOCKS = 8  # up to this many blocks of a feature, comparisons beat a search (log2(blocks) steps)


def _number_ids(ids: torch.Tensor, blocks: Sequence[Tuple[int, int]], first: int, out: torch.Tensor) -> None:
    """Write into `out` the number of the block (first, first + 1, ... in `blocks`' order, sorted and disjoint) that
    holds each id's row, -1 where none does. A few blocks that tile [0, end) with every id inside: one comparison
    per inner edge; otherwise a search over the blocks' edges."""
    if not ids.numel():
        return
    tiled = blocks[0][0] == 0 and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    if tiled and len(blocks) <= _COMPARED_BLOCKS:
        low, high = (int(x) for x in torch.aminmax(ids))
        if 0 <= low and high < blocks[-1][1]:
            out.fill_(first)
            for start, _ in blocks[1:]:
                out.add_(ids >= start)
            return
    edges, numbers, at = [], [-1], 0  # numbers[i + 1]: the block of [edges[i], edges[i + 1])
    for i, (start, end) in enumerate(blocks):
        if start > at:
            edges.append(at), numbers.append(-1)
        edges.append(start), numbers.append(first + i)
        at = end
    edges.append(at), numbers.append(-1)
    found = torch.searchsorted(torch.tensor(edges, dtype=ids.dtype, device=ids.device), ids, right=True)
    torch.index_select(torch.tensor(numbers, dtype=out.dtype, device=ids.device), 0, found, out=out)


class RowWiseSharding(RoutedShardingGroup):
    """The ROW_WISE tables of one sharded collection (output: the base's one level; partial sums added)."""

    sharding_type = ShardingType.ROW_WISE
    output_comm_op = CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER  # (an all-to-all + sum here)

    def check_table_plan(self, table, ps) -> None:
        require(all(s.columns == (0, table.embedding_dim) for s in ps.shards), table, ps,
                "a row block does not hold all columns (use GRID_SHARD to cut columns too)")

    def route(self, batch: FeatureBatch, by_owner: Sequence[Sequence[FeatureShard]]) -> List[List[RoutedIds]]:
        return bucket_by_rows(batch, by_owner, positions=not self.pooled)  # (sequence outputs place each id)
