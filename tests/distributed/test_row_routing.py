"""Row-block routing (row_wise.bucket_by_rows: ROW_WISE, TABLE_ROW_WISE, GRID_SHARD) against a per-bag reference."""

import pytest
import torch

from rectoolkit.distributed.feature_shards import FeatureBatch, FeatureShard
from rectoolkit.distributed.row_wise import bucket_by_rows


def make_batch(seed, features, rows, batch_size, weighted, strides=None):
    """A FeatureBatch of random bags (empty ones included); with `strides`, feature f has strides[f] real bags and
    the rest of batch_size padded empty, as FeatureBatch.from_kjt lays out a VBE batch."""
    g = torch.Generator().manual_seed(seed)
    values, lengths, weights, starts, start = {}, {}, {}, {}, 0
    for f in features:
        real = strides[f] if strides else batch_size
        n = torch.randint(0, 5, (real,), generator=g)
        lengths[f] = torch.cat([n, torch.zeros(batch_size - real, dtype=torch.int64)])
        values[f] = torch.randint(0, rows[f], (int(n.sum()),), generator=g)
        weights[f] = torch.rand(int(n.sum()), generator=g) if weighted else None
        starts[f], start = start, start + int(n.sum())
    return FeatureBatch(batch_size, values, lengths, weights, starts, strides)


def reference(batch, shard):
    """Bag by bag: the ids in [row_start, row_end), shifted, their weights and places in the collection's values."""
    lengths, ids, weights, where = [], [], [], []
    offset = 0
    for n in batch.lengths[shard.feature].tolist():
        kept = 0
        for i in range(offset, offset + n):
            value = int(batch.values[shard.feature][i])
            if shard.row_start <= value < shard.row_end:
                kept += 1
                ids.append(value - shard.row_start)
                where.append(batch.value_starts[shard.feature] + i)
                if batch.weights[shard.feature] is not None:
                    weights.append(float(batch.weights[shard.feature][i]))
        lengths.append(kept)
        offset += n
    return lengths, ids, weights, where


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("variable_batch", [False, True])
def test_row_blocks_route_every_id_to_its_block(weighted, variable_batch):
    rows = {"a": 10, "b": 7, "c": 3}
    strides = {"a": 5, "b": 1, "c": 3} if variable_batch else None
    batch = make_batch(0, list(rows), rows, 5, weighted, strides)
    by_owner = [[], [], []]
    for table, feature in (("ta", "a"), ("tb", "b"), ("tc", "c")):
        # three owners, uneven blocks, an empty one ([3, 3) of "c"), and "b" whole on owner 1 (every id)
        bounds = {"a": [0, 4, 8, 10], "b": [0, 0, 7, 7], "c": [0, 2, 3, 3]}[feature]
        for owner in range(3):
            by_owner[owner].append(FeatureShard(table, feature, feature, owner, owner, bounds[owner],
                                                bounds[owner + 1], 0, 4, rows[feature]))
    routed = bucket_by_rows(batch, by_owner)
    assert [len(r) for r in routed] == [3, 3, 3]
    for shards, results in zip(by_owner, routed):
        for shard, got in zip(shards, results):
            lengths, ids, weights, where = reference(batch, shard)
            assert got.lengths.tolist() == lengths, shard
            assert got.ids.tolist() == ids, shard
            if shard.full_rows:
                assert got.positions is None  # every id, as it is
            else:
                assert got.positions.tolist() == where, shard
            if weighted:
                assert got.weights.tolist() == pytest.approx(weights), shard
            else:
                assert got.weights is None
    assert sum(len(r.ids) for rs in routed for r in rs) == sum(v.numel() for v in batch.values.values())
    pooled = bucket_by_rows(batch, by_owner, positions=False)  # a bag collection: no places asked for
    for results, without in zip(routed, pooled):
        for got, bare in zip(results, without):
            assert bare.positions is None and torch.equal(bare.ids, got.ids) and torch.equal(bare.lengths, got.lengths)


def test_a_block_is_routed_once_per_batch_and_shared():
    rows = {"a": 12}
    batch = make_batch(1, ["a"], rows, 4, False)
    shard = FeatureShard("t", "a", "a", 0, 0, 6, 12, 0, 8, 12)
    twin = FeatureShard("t", "a", "a", 1, 1, 6, 12, 8, 16, 12)  # a column block of the same rows (GRID_SHARD)
    first = bucket_by_rows(batch, [[shard], [twin]])
    assert first[0][0] is first[1][0]
    assert bucket_by_rows(batch, [[shard]])[0][0] is first[0][0]


def test_an_empty_batch_routes_nothing():
    batch = make_batch(2, ["a"], {"a": 5}, 0, True)
    (got,), = bucket_by_rows(batch, [[FeatureShard("t", "a", "a", 0, 0, 0, 2, 0, 4, 5)]])
    assert got.lengths.numel() == 0 and got.ids.numel() == 0 and got.weights.numel() == 0
