"""Figures stay readable from 2 to 64 ranks and from equal to very unequal values (binary units throughout)."""

import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from rectoolkit.viz.comm import comm_matrix_traces
from rectoolkit.viz.memory import memory_traces
from rectoolkit.viz.style import binary_ticks, humanize

GIB, MIB = 2 ** 30, 2 ** 20
BINARY_LABEL = re.compile(r"^(0 B|\d+(\.\d{1,2})? (B|KiB|MiB|GiB|TiB))$")


@given(st.floats(min_value=1, max_value=2 ** 50, allow_nan=False))
def test_binary_ticks_cover_the_top_with_few_short_labels(top):
    values, labels = binary_ticks(top)
    assert values[0] == 0 and values[-1] >= top * 0.999  # the largest value is under a labelled tick
    assert 2 <= len(values) <= 7 and values == sorted(values)
    assert all(BINARY_LABEL.match(label) for label in labels), labels


@pytest.mark.parametrize("world_size", [2, 8, 64])
def test_equal_traffic_heatmap_has_a_sane_colour_range(world_size):
    matrix = np.full((world_size, world_size), 307.84e6)  # the case: the same bytes on every link
    (trace,), layout = comm_matrix_traces({"output_dist": matrix})
    assert trace["zmin"] == 0 and trace["zmax"] == pytest.approx(307.84e6)
    assert all(BINARY_LABEL.match(label) for label in trace["colorbar"]["ticktext"])
    assert trace["colorbar"]["ticktext"][-1] == "300 MiB" or trace["colorbar"]["tickvals"][-1] >= 307.84e6
    # cell text only while cells are big enough to hold it
    assert (trace["texttemplate"] is not None) == (world_size <= 6)


def test_tiny_usage_gets_a_hint_and_an_axis_that_shows_the_bars():
    memory = pd.DataFrame({"rank": range(8), "weights": [280 * MIB] * 8, "optimizer": [0] * 8,
                           "hbm_bytes": [280 * MIB] * 8, "hbm_cap_bytes": [32 * GIB] * 8})
    _, layout = memory_traces(memory)
    (note,) = layout["annotations"]
    assert "280.00 MiB" in note["text"] and "32.00 GiB" in note["text"] and "0.85%" in note["text"]
    assert layout["yaxis"]["range"][1] < 1 * GIB  # scaled to the usage, not to 32 GiB
    assert all(label.endswith("iB") or label == "0 B" for label in layout["yaxis"]["ticktext"])


def test_full_usage_axis_reaches_the_capacity_in_gib():
    memory = pd.DataFrame({"rank": [0, 1], "weights": [10 * GIB, 12 * GIB], "hbm_bytes": [10 * GIB, 12 * GIB],
                           "hbm_cap_bytes": [16 * GIB, 16 * GIB]})
    _, layout = memory_traces(memory)
    assert layout["annotations"] == []
    assert layout["yaxis"]["range"][1] >= 16 * GIB
    assert "16 GiB" in layout["yaxis"]["ticktext"]  # the capacity line sits on a labelled tick
    assert "legend" not in layout  # plotly's default: on the right, never over the title


def test_humanized_cells():
    assert humanize(206209024.0, "weights_bytes") == "196.66 MiB"
    assert humanize(3 * 2 ** 20, "bytes sent, estimated") == humanize(3 * 2 ** 20, "bytes_across_links") == "3.00 MiB"
    assert humanize(3 * 2 ** 20, "megabytes_per_s") == "3,145,728"  # not a byte count
    assert humanize(15.823211669921875, "slowest_ms") == "15.82 ms"
    assert humanize(0.123456789012345, "ratio") == "0.1235"
    assert humanize(np.int64(1000000), "rows") == "1,000,000"
    assert humanize("row_wise", "sharding_type") == "row_wise"


def test_plan_diff_axis_is_symmetric_in_binary_units():
    from rectoolkit.viz.style import signed_bytes_axis

    axis = signed_bytes_axis(-3 * MIB, "bytes (new - old)")  # 3 MiB / 4 steps -> a 1 MiB step
    assert axis["ticktext"] == ["-3 MiB", "-2 MiB", "-1 MiB", "0 B", "1 MiB", "2 MiB", "3 MiB"]
    assert axis["tickvals"] == [k * MIB for k in range(-3, 4)]
    assert axis["range"][0] < -3 * MIB and axis["range"][1] > 3 * MIB


def test_training_curves_say_when_no_step_is_reported_yet():
    from rectoolkit.viz.training import training_curves_traces

    empty_traces, empty = training_curves_traces([])
    assert [a["text"] for a in empty["annotations"]] == [
        "no step reported yet: the curves start with the workers' first report"]
    assert all(len(t["x"]) == 0 for t in empty_traces)
    assert not any(empty[k]["showticklabels"] or empty[k]["zeroline"] for k in empty if k[1:5] == "axis")
    traces, drawn = training_curves_traces([{"step": 1, "loss": 0.7, "auc": 0.5, "samples_per_s": 100.0}])
    assert "annotations" not in drawn and [list(t["y"]) for t in traces] == [[0.7], [0.5], [100.0], [], []]  # NE, calibration: not reported
