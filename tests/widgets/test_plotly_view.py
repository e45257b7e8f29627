"""PlotlyView's Python side: the JSON it sends is the figure's, one message per change, plotly.js on request,
and "drawn" reports from the page (widgets/plotly_view.js draws them; tests/browser checks the page side)."""

import json
import time
from pathlib import Path

import numpy as np
import plotly
import plotly.io as pio
import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.viz.training import metrics_frame, training_curves_traces
from rectoolkit.widgets.explorer import PlanExplorer
from rectoolkit.widgets.inputs import TableSet
from rectoolkit.widgets.live_figure import LazyFigure, LiveFigure
from rectoolkit.widgets.monitor import TrainingMonitor
from rectoolkit.widgets.plotly_view import PlotlyView

pytestmark = pytest.mark.timeout(120)


def _record_messages(widget):
    """What the widget sends to the page, as (message, buffers), instead of sending it."""
    sent = []
    widget._send = lambda message, buffers=None: sent.append((message, buffers))
    return sent


def _wire(sent):
    """The update messages' state as the page receives it (JSON text, NaN not allowed)."""
    return [json.loads(json.dumps(message["state"], allow_nan=False)) for message, _ in sent
            if message.get("method") == "update"]


def test_the_json_sent_is_the_figure_plotly_would_write():
    traces = [dict(type="bar", name="rank 0", x=np.array(["a", "b"]), y=np.array([1.5, np.nan])),
              dict(type="scatter", x=(1, 2), y=[np.float32(0.5), np.inf], marker=dict(size=np.int64(3)))]
    layout = dict(title=dict(text="memory"), height=300, xaxis=dict(range=np.array([0.0, 2.0])))
    live = LiveFigure(traces, layout)
    sent = live.widget.figure
    # plotly's own JSON writer (NaN and inf become null) is the reference
    expected = json.loads(pio.to_json({"data": traces, "layout": layout}, validate=False))
    assert expected["data"][0]["y"] == [1.5, None] and expected["data"][1]["y"] == [0.5, None]  # hand-checked
    assert sent["data"] == expected["data"]
    assert sent["layout"] == expected["layout"]
    assert sent["config"] == {"displaylogo": False, "responsive": True}
    json.dumps(live.widget.get_state()["figure"], allow_nan=False)  # valid JSON on the wire


def test_a_change_is_one_message_to_the_same_view_and_nothing_is_sent_without_one():
    live = LiveFigure([dict(type="bar", x=["a", "b"], y=[1, 2])], dict(title=dict(text="t")))
    view = live.widget
    sent = _record_messages(view)
    assert live.show([dict(type="bar", x=["a", "b"], y=[1, 2])], dict(title=dict(text="t"))) == []
    assert sent == []
    assert live.show([dict(type="bar", x=["a", "b", "c"], y=[3, 4, 5])], dict(title=dict(text="t"))) == [
        "data[0].x", "data[0].y"]
    assert live.widget is view  # updated in place: the same widget, the page keeps its plot
    [state] = _wire(sent)  # figure and revision together, in one message
    assert state["revision"] == 2
    assert state["figure"]["data"] == [{"type": "bar", "x": ["a", "b", "c"], "y": [3, 4, 5]}]
    assert state["figure"]["layout"] == {"title": {"text": "t"}}


def test_lazy_figure_keeps_its_view_across_updates():
    lazy = LazyFigure("memory")
    lazy.show([dict(type="bar", x=["a"], y=[1])], {})
    view = lazy.widget
    lazy.show([dict(type="bar", x=["a"], y=[7])], {})
    assert lazy.container.children == (view,) and view.figure["data"][0]["y"] == [7]


def test_the_page_gets_plotly_js_from_the_kernel_on_request():
    view = PlotlyView({"data": []})
    sent = _record_messages(view)
    view._handle_custom_msg({"event": "plotly-js?"}, [])
    [(message, buffers)] = sent
    assert message["content"] == {"event": "plotly-js"}
    shipped = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert bytes(buffers[0]) == shipped.read_bytes()


def test_when_drawn_waits_for_the_page_to_show_the_current_revision():
    view = PlotlyView({"data": [{"type": "bar", "y": [1]}]})
    seen = []
    view.when_drawn(seen.append)
    view.show({"data": [{"type": "bar", "y": [2]}]})
    view._handle_custom_msg({"event": "drawn", "revision": 1}, [])  # the old figure: still waiting
    assert seen == [] and view.drawn_revision == 1
    view._handle_custom_msg({"event": "drawn", "revision": 2}, [])
    assert len(seen) == 1 and seen[0] >= 0 and view.drawn_revision == 2
    view.when_drawn(seen.append)  # already on screen: at once
    assert len(seen) == 2


def test_a_figure_without_data_or_with_unknown_keys_is_refused():
    with pytest.raises(ValueError, match="'data'"):
        PlotlyView({"layout": {}})
    with pytest.raises(ValueError, match="frames"):
        PlotlyView({"data": [], "frames": []})


def test_explorer_world_size_change_updates_the_placement_view_in_place():
    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 * (i + 1), embedding_dim=16,
                                 feature_names=[f"f{i}"]) for i in range(3)]
    explorer = PlanExplorer(TableSet(tables, {f"f{i}": 2.0 for i in range(3)}, batch_size=32), world_size=4,
                            memory_per_rank_gib=1.0, compute_device="cuda")
    view = explorer.placement_fig.widget
    revision = view.revision
    explorer.set(world_size=2)
    assert explorer.placement_fig.widget is view and view.revision > revision
    ranks = [t["name"] for t in view.figure["data"] if t.get("name", "").startswith("rank ")]
    assert ranks == ["rank 0", "rank 1"]


def _idle(ctx):
    return ctx.rank


def test_monitor_first_paint_is_what_the_probe_and_the_view_report():
    monitor = TrainingMonitor(_idle, 2, total_steps=4)
    assert monitor.first_paint_ms == {"panel": None, "curves": None}  # not displayed yet
    monitor._repr_mimebundle_()
    assert monitor.first_paint_ms == {"panel": None, "curves": None}  # no page has shown it
    time.sleep(0.02)
    monitor._paint_probe._handle_custom_msg({"event": "painted"}, [])
    view = monitor.curves.widget
    view._handle_custom_msg({"event": "drawn", "revision": view.revision}, [])
    paint = monitor.first_paint_ms
    assert 20 <= paint["panel"] <= paint["curves"] < 60_000, paint


def test_monitor_curves_update_their_view_in_place():
    monitor = TrainingMonitor(_idle, 2, total_steps=4)
    view = monitor.curves.widget
    traces, layout = training_curves_traces(metrics_frame([{"step": 1, "rank": 0, "loss": 0.5}]), title="run")
    assert monitor.curves.show(traces, layout)  # something changed
    assert monitor.curves.widget is view and view.revision == 2
    losses = [t for t in view.figure["data"] if t.get("name") == "loss"]
    assert losses and losses[0]["y"] == [0.5], view.figure["data"]
