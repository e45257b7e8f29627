"""A plotly FigureWidget kept in sync with (traces, layout) specs by setting only what changed.

Plotly validates every property it is given, so re-sending a whole figure on each click is slow. A
LiveFigure remembers the last spec it drew and, when the trace structure is unchanged, sets only the
properties whose values differ, inside one `batch_update()` (one message to the browser).

    >>> live = LiveFigure([dict(type="bar", x=["a"], y=[1])], dict(title=dict(text="one")))
    >>> live.show([dict(type="bar", x=["a"], y=[2])], dict(title=dict(text="one")))
    ['data[0].y']
    >>> live.widget.data[0].y
    (2,)
"""

from __future__ import annotations

from typing import Any, List, Mapping, Sequence

import numpy as np


def same_value(a: Any, b: Any) -> bool:
    """Deep equality that understands numpy arrays (NaN equals NaN) inside lists and dicts."""
    if a is b:
        return True
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        if a_arr.shape != b_arr.shape or a_arr.dtype.kind != b_arr.dtype.kind:
            return False
        if a_arr.dtype.kind == "f":
            return bool(np.array_equal(a_arr, b_arr, equal_nan=True))
        return bool(np.array_equal(a_arr, b_arr))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def json_safe(value: Any) -> Any:
    """Replace NaN / inf in float arrays (and lists) by None, recursively.

    Plotly sends updates as JSON, where NaN is not allowed (Jupyter warns and the browser may drop the
    message); None becomes null, which plotly.js draws as a gap, as NaN was meant to be.
    """
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return np.where(np.isfinite(value), value, None).tolist()
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if any(isinstance(v, float) and not np.isfinite(v) for v in value):
            return [None if isinstance(v, float) and not np.isfinite(v) else v for v in value]
        if value and isinstance(value[0], (list, tuple, np.ndarray, dict)):
            return [json_safe(v) for v in value]
    return value


class LiveFigure:
    """Owns one `go.FigureWidget`; `show(traces, layout)` redraws it with the fewest property writes.

    Returns the list of what was written ("data[i].key", "layout.key" or "rebuild"), which tests use to
    check that an update happened in place.
    """

    def __init__(self, traces: Sequence[dict], layout: dict) -> None:
        import plotly.graph_objects as go

        traces = [json_safe(dict(t)) for t in traces]
        self.widget = go.FigureWidget(data=traces, layout=dict(layout))
        self._traces: List[dict] = [dict(t) for t in traces]
        self._layout: dict = dict(layout)

    def show(self, traces: Sequence[dict], layout: dict) -> List[str]:
        traces = [json_safe(dict(t)) for t in traces]
        layout = json_safe(dict(layout))
        fig = self.widget
        written: List[str] = []
        same_structure = len(traces) == len(self._traces) and all(
            new.get("type") == old.get("type") and new.keys() == old.keys() for new, old in zip(traces, self._traces))
        if not same_structure:
            with fig.batch_update():
                fig.data = []
            fig.add_traces(traces)
            written.append("rebuild")
        else:
            with fig.batch_update():
                for index, (new, old) in enumerate(zip(traces, self._traces)):
                    for key, value in new.items():
                        if key != "type" and not same_value(value, old.get(key)):
                            fig.data[index][key] = value
                            written.append(f"data[{index}].{key}")
                self._write_layout(layout, written)
        if not same_structure:
            with fig.batch_update():
                self._write_layout(layout, written)
        self._traces, self._layout = traces, layout
        return written

    def _write_layout(self, layout: dict, written: List[str]) -> None:
        fig = self.widget
        for key in set(layout) | set(self._layout):
            new, old = layout.get(key), self._layout.get(key)
            if not same_value(new, old):
                fig.layout[key] = new
                written.append(f"layout.{key}")

    @property
    def data(self):
        return self.widget.data

    @property
    def layout(self):
        return self.widget.layout


class LazyFigure:
    """A LiveFigure made on its first `show()`, inside a fixed `container` box.

    Every plotly FigureWidget carries plotly.js in its state (about 5 MB sent to the browser), so a widget
    with many tabs creates each figure only when its tab is first drawn.
    """

    def __init__(self) -> None:
        import ipywidgets as w

        self.container = w.VBox()
        self.live: "LiveFigure | None" = None

    def show(self, traces: Sequence[dict], layout: dict) -> List[str]:
        if self.live is None:
            self.live = LiveFigure(traces, layout)
            self.container.children = [self.live.widget]
            return ["create"]
        return self.live.show(traces, layout)

    @property
    def widget(self):
        return self.live.widget if self.live is not None else None

    @property
    def data(self):
        return self.live.widget.data if self.live is not None else ()

    @property
    def layout(self):
        return self.live.widget.layout if self.live is not None else None
