"""Every figure builder: the traces carry the numbers they should (hand-worked), for plotly and matplotlib."""

import numpy as np
import pandas as pd
import pytest

from rectoolkit.plan.traffic import step_traffic
from rectoolkit.viz import (
    comm_matrix_figure, comm_summary, measured_vs_estimated_figure, memory_figure, plan_diff_figure,
    rank_table_figure, rank_time_figure, shard_placement_figure, training_curves_figure,
)
from rectoolkit.viz.placement import table_rectangles
from rectoolkit.viz.frames import placement_frame
from rectoolkit.viz.style import OVERFLOW_COLOR, REPLICATED_COLOR, rank_color


def _polygons(trace):
    """Closed rectangles of a fill trace: lists of (x, y) split at the gaps."""
    shapes, current = [], []
    for x, y in zip(trace.x, trace.y):
        if x is None or (isinstance(x, float) and np.isnan(x)):
            shapes.append(current)
            current = []
        else:
            current.append((x, y))
    return shapes + ([current] if current else [])


def test_shard_placement_draws_each_shard_on_its_rank(plan, tables):
    fig = shard_placement_figure(plan, tables)
    by_name = {t.name: t for t in fig.data}
    rank0, rank1 = _polygons(by_name["rank 0"]), _polygons(by_name["rank 1"])
    assert len(rank0) == 2 and len(rank1) == 2  # big rows 0:600 + wide cols 8:16 / big rows 600: + wide cols 0:8
    assert by_name["rank 0"].fillcolor == rank_color(0)
    assert len(_polygons(by_name["replicated (data parallel)"])) == 1  # small drawn once, grey
    assert by_name["replicated (data parallel)"].fillcolor == REPLICATED_COLOR
    # big's row split: rank 0's block is 600/1000 of the table's height, rank 1's 400/1000
    rects = table_rectangles(placement_frame(plan, tables)).set_index("table")
    height = rects.loc["big", "height"]
    block0 = rank0[0]
    assert max(y for _, y in block0) - min(y for _, y in block0) == pytest.approx(0.6 * height)
    block1 = rank1[0]
    assert max(y for _, y in block1) - min(y for _, y in block1) == pytest.approx(0.4 * height)
    hover = by_name["shards"].hovertext
    assert len(hover) == 5 and "rows 600:1000" in hover[1]


def test_placement_trace_count_depends_only_on_world_size(plan, tables):
    assert len(shard_placement_figure(plan, tables, world_size=4).data) == 4 + 3


def test_rank_table_figure_values(plan, tables):
    heat = rank_table_figure(plan, tables).data[0]
    assert list(heat.x) == ["big", "wide", "small"]
    assert np.asarray(heat.z).tolist() == [[19200, 3200, 80], [12800, 3200, 80]]


def test_memory_figure_stacks_and_overflow():
    memory = pd.DataFrame({"rank": [0, 1, 2], "weights_bytes": [50, 80, 10], "optimizer_bytes": [50, 40, 0],
                           "dense_bytes": [5, 5, 5], "capacity_bytes": [100, 200, 100], "total_bytes": [105, 125, 15]})
    fig = memory_figure(memory)
    names = [t.name for t in fig.data]
    assert names == ["weights", "optimizer", "dense", "over capacity", "capacity"]  # total_bytes not stacked
    optimizer = fig.data[1]
    assert np.asarray(optimizer.base).tolist() == [50, 80, 10]  # stacked on the weights
    over = fig.data[3]
    assert np.asarray(over.y).tolist() == [5, 0, 0]
    assert np.asarray(over.base).tolist() == [100, 125, 15]
    assert over.marker.color == OVERFLOW_COLOR
    assert np.asarray(fig.data[4].y).tolist() == [100, 200, 100]


def test_memory_figure_explicit_columns_and_errors():
    memory = pd.DataFrame({"rank": [0], "a_bytes": [1], "b": [2]})
    assert [t.name for t in memory_figure(memory, components=["b"]).data][0] == "b"
    with pytest.raises(KeyError, match="no column"):
        memory_figure(memory, components=["nope"])


def test_comm_matrix_total_and_menu(plan, tables):
    counts = {"f_big": 3, "f_wide": 2, "f_small": 1}
    rows = {t.name: t.num_embeddings for t in tables}
    matrices = step_traffic(plan.plan[""], tables, world_size=2, local_world_size=2, batch_sizes=[2, 2],
                            count_ids=lambda rank, f, lo, hi: counts[f] if (lo, hi) == (0, rows[f.replace('f_', '')]) else 0)
    fig = comm_matrix_figure(matrices)
    total = sum(np.asarray(m, dtype=float) for m in matrices.values())
    assert np.asarray(fig.data[0].z).tolist() == total.tolist()
    labels = [b.label for b in fig.layout.updatemenus[0].buttons]
    assert labels[0] == "total" and "input_dist" in labels and "output_dist" in labels
    assert "output_dist_intra" not in labels  # all-zero collectives are left out
    single = comm_matrix_figure(matrices, "input_dist", with_menu=False)
    assert np.asarray(single.data[0].z).tolist() == np.asarray(matrices["input_dist"], dtype=float).tolist()
    with pytest.raises(KeyError, match="choose one of"):
        comm_matrix_figure(matrices, "nope")


def test_comm_summary_hand_case():
    matrices = {"a": np.array([[5, 10], [0, 0]]), "b": np.array([[0, 0], [7, 1]])}
    summary = comm_summary(matrices).set_index("collective")
    assert summary.loc["total", "bytes"] == 23
    assert summary.loc["total", "bytes_across_links"] == 17
    assert summary.loc["a", "busiest_sender"] == 0 and summary.loc["b", "busiest_sender"] == 1


def test_rank_time_figure():
    times = pd.DataFrame({"rank": [0, 1, 2], "lookup_ms": [1.0, 3.0, 2.0], "comm_ms": [2.5, 0.1, 0.2],
                          "total_ms": [3.5, 3.1, 2.2]})
    fig = rank_time_figure(times)
    assert [t.name for t in fig.data] == ["lookup", "comm"]
    assert "slowest: rank 0, 3.50 ms" in fig.layout.title.text
    assert list(fig.data[0].marker.line.color) == [OVERFLOW_COLOR, "rgba(0,0,0,0)", "rgba(0,0,0,0)"]


def test_plan_diff_figure(plan, tables):
    moved = {"big": plan.plan[""]["big"], "wide": plan.plan[""]["wide"], "small": plan.plan[""]["small"]}
    same = plan_diff_figure(plan, moved, tables)
    assert np.asarray(same.data[0].y).tolist() == [0, 0]
    assert "identical" in same.layout.title.text


def test_training_curves_merge_ranks():
    records = [{"rank": r, "step": s, "loss": 1.0 / s + r, "samples_per_s": 100.0 + r} for s in (1, 2) for r in (0, 1)]
    fig = training_curves_figure(records)
    assert np.asarray(fig.data[0].y).tolist() == [1.5, 1.0]  # mean over ranks
    assert np.asarray(fig.data[2].y).tolist() == [100.5, 100.5]
    assert len(fig.data[1].y) == 0  # no AUC reported


def test_training_curves_show_ne_and_calibration():
    records = [{"rank": r, "step": s, "loss": 0.5, "window_ne": 0.9 - 0.1 * s, "window_calibration": 1.0 + r}
               for s in (1, 2) for r in (0, 1)]
    fig = training_curves_figure(records)
    assert [trace.name for trace in fig.data][3:] == ["NE (window)", "calibration (window)"]
    assert np.asarray(fig.data[3].y).tolist() == pytest.approx([0.8, 0.7])
    assert np.asarray(fig.data[4].y).tolist() == [1.5, 1.5]  # mean over ranks


def test_measured_vs_estimated_from_matrices():
    est = {"a": np.array([[0, 10], [4, 0]])}
    meas = {"a": np.array([[0, 11], [4, 0]])}
    fig = measured_vs_estimated_figure(est, meas)
    assert np.asarray(fig.data[0].y).tolist() == [10, 4]
    assert np.asarray(fig.data[1].y).tolist() == [11, 4]
    assert "1.100x" in fig.data[1].customdata[0]
    with pytest.raises(ValueError, match="ranks"):
        measured_vs_estimated_figure([1, 2], [1, 2, 3])


@pytest.mark.parametrize("builder", ["placement", "rank_table", "memory", "comm", "time"])
def test_matplotlib_backend(builder, plan, tables):
    from matplotlib.figure import Figure

    memory = pd.DataFrame({"rank": [0, 1], "weights_bytes": [150, 10], "capacity_bytes": [100, 100]})
    times = pd.DataFrame({"rank": [0, 1], "lookup_ms": [1.0, 2.0], "comm_ms": [1.0, 0.5]})
    matrices = {"input_dist": np.array([[0, 8], [8, 0]])}
    fig = {
        "placement": lambda: shard_placement_figure(plan, tables, backend="matplotlib"),
        "rank_table": lambda: rank_table_figure(plan, tables, backend="matplotlib"),
        "memory": lambda: memory_figure(memory, backend="matplotlib"),
        "comm": lambda: comm_matrix_figure(matrices, backend="matplotlib"),
        "time": lambda: rank_time_figure(times, backend="matplotlib"),
    }[builder]()
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    if builder == "placement":
        assert len(ax.patches) == 5  # 2 + 2 shards + one replicated drawing
    if builder == "memory":
        assert len(ax.patches) == 3  # two weight bars + one overflow bar (rank 0 is 50 over)
        assert ax.patches[-1].get_height() == 50
    if builder == "comm":
        assert ax.images[0].get_array().tolist() == [[0, 8], [8, 0]]
    if builder == "time":
        assert "slowest: rank 1" in ax.get_title()
