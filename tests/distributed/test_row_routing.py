"""Row-block routing (row_wise.bucket_by_rows: ROW_WISE, TABLE_ROW_WISE, GRID_SHARD) against a per-bag reference."""

import pytest
import torch

from rectoolkit.distributed import row_wise

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


@pytest.fixture(params=["masks", "numbers"], autouse=True)
def routing(request, monkeypatch):
    """Both ways of routing: a mask per block (few ids, or a GPU) and numbering each id by its block, then sorting
    (many ids on CPU: comparisons where a feature's blocks tile its rows, a search otherwise)."""
    monkeypatch.setattr(row_wise, "_MASKED_IDS", 10 ** 9 if request.param == "masks" else 0)
    return request.param


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


def _random_blocks(g, rows):
    """Blocks of each feature as a plan may cut them: tiling all rows (2-10 blocks, some empty), leaving gaps, or
    overlapping (the same rows twice, as two groups of one collection may route them)."""
    blocks = []
    for feature, n in rows.items():
        kind = int(torch.randint(0, 3, (1,), generator=g))
        cuts = sorted(int(c) for c in torch.randint(0, n + 1, (int(torch.randint(1, 10, (1,), generator=g)),),
                                                    generator=g))
        edges = [0, *cuts, n]
        spans = list(zip(edges, edges[1:]))
        if kind == 1:  # gaps: every other block left out
            spans = spans[::2]
        elif kind == 2:  # overlaps: another cut of the same feature besides
            spans += [(0, n // 2), (n // 3, n)]
        blocks += [(feature, start, end) for start, end in spans]
    return blocks


class _Block:
    def __init__(self, feature, row_start, row_end):
        self.feature, self.row_start, self.row_end = feature, row_start, row_end


@pytest.mark.parametrize("seed", range(12))
def test_random_cuts_gaps_and_overlaps_route_as_bag_by_bag(seed):
    from rectoolkit.distributed.row_wise import block_ids

    g = torch.Generator().manual_seed(100 + seed)
    rows = {f: int(torch.randint(1, 60, (1,), generator=g)) for f in ("a", "b", "c", "d")}
    strides = {f: int(torch.randint(0, 7, (1,), generator=g)) for f in rows} if seed % 3 == 0 else None
    batch = make_batch(seed, list(rows), rows, 6, weighted=seed % 2 == 0, strides=strides)
    if seed % 4 == 1:  # ids outside their table (a collection with ids_out_of_range="unchecked"): routed nowhere
        batch.values["a"][::3] = rows["a"] + 5
        batch.values["b"][::4] = -2
    blocks = _random_blocks(g, rows)
    positions = seed % 2 == 1
    got = block_ids(batch, [(f, start, end, positions) for f, start, end in blocks])
    assert len(got) == len(blocks)
    for (feature, start, end), routed in zip(blocks, got):
        lengths, ids, weights, where = reference(batch, _Block(feature, start, end))
        assert routed.lengths.tolist() == lengths, (feature, start, end)
        assert routed.ids.tolist() == ids and routed.ids.dtype == torch.int64, (feature, start, end)
        assert (routed.positions.tolist() == where) if positions else routed.positions is None
        if batch.weights[feature] is None:
            assert routed.weights is None
        else:
            assert routed.weights.tolist() == pytest.approx(weights)


def test_more_blocks_than_a_small_number_can_count_are_routed():
    from rectoolkit.distributed.row_wise import block_ids

    rows = 2 ** 15 + 3  # one-row blocks: more block numbers than int16 holds
    batch = make_batch(7, ["a"], {"a": rows}, 40, weighted=False)
    blocks = [("a", r, r + 1, False) for r in range(rows)]
    got = block_ids(batch, blocks)
    ids = batch.values["a"].tolist()
    for row in {*ids, 0, rows - 1}:
        assert got[row].ids.tolist() == [0] * ids.count(row)
        assert int(got[row].lengths.sum()) == ids.count(row)
