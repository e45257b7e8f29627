"""Placement frames, rank x table bytes and plan diffs, checked against hand-worked numbers."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.viz.frames import placement_frame, plan_diff, rank_table_bytes, table_shardings, weights_per_rank


def test_placement_frame_rows_and_bytes(plan, tables):
    frame = placement_frame(plan, tables)
    assert len(frame) == 6
    big = frame[frame.table == "big"]
    assert big[["rank", "row_start", "row_end", "bytes"]].values.tolist() == [[0, 0, 600, 600 * 8 * 4],
                                                                              [1, 600, 1000, 400 * 8 * 4]]
    wide = frame[frame.table == "wide"]
    assert wide[["rank", "col_start", "col_end", "bytes"]].values.tolist() == [[1, 0, 8, 3200], [0, 8, 16, 3200]]
    small = frame[frame.table == "small"]
    assert small["bytes"].tolist() == [10 * 4 * 2, 10 * 4 * 2]  # FP16: 2 bytes per element


def test_rank_table_bytes_and_weights(plan, tables):
    frame = placement_frame(plan, tables)
    grid = rank_table_bytes(frame)
    assert list(grid.columns) == ["big", "wide", "small"]
    assert grid.loc[0].tolist() == [19200, 3200, 80]
    assert grid.loc[1].tolist() == [12800, 3200, 80]
    assert weights_per_rank(frame, 3).tolist() == [22480, 16080, 0]


def test_placement_without_configs_infers_size():
    plan = {"t": ParameterSharding("table_wise", ranks=[2], shards=[ShardMetadata.on_rank(2, 0, 0, 7, 3)])}
    frame = placement_frame(plan)
    assert frame[["num_embeddings", "embedding_dim", "bytes"]].values.tolist() == [[7, 3, 84]]


def test_table_shardings_prefixes_duplicate_names():
    ps = ParameterSharding("table_wise", ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, 2, 2)])
    plan = ShardingPlan({"a": {"t": ps, "u": ps}, "b": {"t": ps}})
    assert sorted(table_shardings(plan)) == ["a.t", "b.t", "u"]


def test_plan_diff_statuses_and_deltas(plan, tables):
    new = ShardingPlan({"": {
        "big": plan.plan[""]["big"],  # unchanged
        "wide": ParameterSharding("table_wise", ranks=[1], shards=[ShardMetadata.on_rank(1, 0, 0, 100, 16)]),
        "small": ParameterSharding("data_parallel", ranks=[0, 1], shards=[
            ShardMetadata.on_rank(0, 0, 0, 10, 4), ShardMetadata.on_rank(1, 0, 0, 10, 4)]),
    }})
    diff = plan_diff(plan, new, tables)
    status = dict(zip(diff.tables.table, diff.tables.status))
    assert status == {"big": "same", "wide": "resharded", "small": "same"}
    moved = dict(zip(diff.tables.table, diff.tables.moved_bytes))
    # wide's columns 0:8 already live on rank 1; columns 8:16 (100 x 8 x 4 B) come from rank 0
    assert moved["wide"] == 3200
    assert diff.ranks["delta_bytes"].tolist() == [-3200, 3200]
    assert "1 resharded" in diff.summary()


def test_plan_diff_added_and_removed(tables):
    ps = ParameterSharding("table_wise", ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, 100, 16)])
    diff = plan_diff({"wide": ps}, {"small": ParameterSharding(
        "table_wise", ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, 10, 4)])}, tables)
    assert dict(zip(diff.tables.table, diff.tables.status)) == {"wide": "removed", "small": "added"}
    assert diff.ranks["delta_bytes"].tolist() == [80 - 6400]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 50), cols=st.integers(1, 9), world=st.integers(1, 4), data=st.data())
def test_moved_bytes_law(rows, cols, world, data):
    """Moving a table-wise table between ranks moves all its bytes; leaving it in place moves none."""
    src = data.draw(st.integers(0, world - 1))
    dst = data.draw(st.integers(0, world - 1))
    a = {"t": ParameterSharding("table_wise", ranks=[src], shards=[ShardMetadata.on_rank(src, 0, 0, rows, cols)])}
    b = {"t": ParameterSharding("table_wise", ranks=[dst], shards=[ShardMetadata.on_rank(dst, 0, 0, rows, cols)])}
    diff = plan_diff(a, b)
    assert diff.moved_bytes == (0 if src == dst else rows * cols * 4)
    assert int(diff.ranks["delta_bytes"].sum()) == 0
    assert np.abs(diff.ranks["delta_bytes"]).sum() == (0 if src == dst else 2 * rows * cols * 4)
