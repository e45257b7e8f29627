"""A figure in a widget, redrawn in place from (traces, layout) specs, with plotly.js loaded once per page.

A plotly `FigureWidget` carries its own copy of plotly.js (about 5 MB, sent to the browser and parsed again
for every figure), which made each tab of the explorer open blank for seconds; plotly's own output type
(`application/vnd.plotly.v1+json`) loads plotly.js once, but every redraw replaces the output, so plotly.js
builds the whole plot anew (and renders a PNG copy of it). A LiveFigure shows its figure in a `PlotlyView`
(rectoolkit.widgets.plotly_view): plotly.js is loaded once per page, and a redraw sends only the figure's JSON,
which the page applies to the plot already there with Plotly.react. Nothing is sent when nothing changed.
Until plotly.js has drawn the figure its box shows "drawing the figure ...".

    >>> live = LiveFigure([dict(type="bar", x=["a"], y=[1])], dict(title=dict(text="one")))
    >>> live.show([dict(type="bar", x=["a"], y=[2])], dict(title=dict(text="one")))
    ['data[0].y']
    >>> live.data[0].y
    (2,)
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any, Callable, List, Mapping, Optional, Sequence

import anywidget
import numpy as np
import traitlets

from rectoolkit.widgets.assets import read_asset
from rectoolkit.widgets.plotly_view import PlotlyView

# A turning ring before "working" texts (CSS only: an emoji hourglass needs a font that a browser may lack).
# Its keyframes come with the first figure's view (widgets/plotly_view.js), which puts them on the page once:
# a <style> added and removed with every busy message would make the browser restyle the whole page each time.
SPINNER = ('<span class="rtk-spinner" style="display:inline-block;width:9px;height:9px;margin-right:5px;'
           'border:2px solid currentColor;border-right-color:transparent;border-radius:50%;'
           'animation:rtk-spin 0.8s linear infinite"></span>')
FIGURE_CLASS = "rtk-figure"


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


def to_json_value(value: Any) -> Any:
    """Numpy arrays and scalars -> lists and Python numbers (NaN / inf -> None), recursively, for JSON."""
    value = json_safe(value)
    if isinstance(value, np.ndarray):
        return [to_json_value(v) for v in value.tolist()] if value.dtype.kind == "O" else value.tolist()
    if isinstance(value, np.generic):
        return to_json_value(value.item())
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return value


def _changes(traces: Sequence[dict], layout: dict, old_traces: Sequence[dict], old_layout: dict) -> List[str]:
    """What differs from the last drawing: "data[i].key", "layout.key", or "rebuild" (other traces)."""
    same_structure = len(traces) == len(old_traces) and all(
        new.get("type") == old.get("type") and new.keys() == old.keys() for new, old in zip(traces, old_traces))
    if not same_structure:
        return ["rebuild"]
    written = [f"data[{index}].{key}" for index, (new, old) in enumerate(zip(traces, old_traces))
               for key, value in new.items() if key != "type" and not same_value(value, old.get(key))]
    written += [f"layout.{key}" for key in sorted(set(layout) | set(old_layout))
                if not same_value(layout.get(key), old_layout.get(key))]
    return written


def figure_json(traces: Sequence[dict], layout: dict) -> dict:
    """The figure as PlotlyView sends it: `{"data": traces, "layout": layout}` in plain JSON values."""
    return {"data": to_json_value(list(traces)), "layout": to_json_value(layout)}


class LiveFigure:
    """Owns one `PlotlyView` (`widget`); `show(traces, layout)` redraws it in place when something changed.

    Returns the list of what changed ("data[i].key", "layout.key" or "rebuild"), which tests use to check
    that an update happened. `data` and `layout` give the figure as plotly objects (built on demand).
    """

    def __init__(self, traces: Sequence[dict], layout: dict) -> None:
        self._traces: List[dict] = [json_safe(dict(t)) for t in traces]
        self._layout: dict = json_safe(dict(layout))
        self._figure = None
        self.widget = PlotlyView(figure_json(self._traces, self._layout))
        self.widget.add_class(FIGURE_CLASS)

    def show(self, traces: Sequence[dict], layout: dict) -> List[str]:
        traces = [json_safe(dict(t)) for t in traces]
        layout = json_safe(dict(layout))
        written = _changes(traces, layout, self._traces, self._layout)
        if written:
            self._draw(traces, layout)
        return written

    def _draw(self, traces: List[dict], layout: dict) -> None:
        self._traces, self._layout, self._figure = traces, layout, None
        self.widget.show(figure_json(traces, layout))

    def _plotly_figure(self):
        if self._figure is None:
            import plotly.graph_objects as go

            self._figure = go.Figure(data=self._traces, layout=self._layout)
        return self._figure

    @property
    def data(self):
        return self._plotly_figure().data

    @property
    def layout(self):
        return self._plotly_figure().layout


PAINT_FALLBACK_S = 5.0  # where no page shows the probe (a script, a headless run), go on after this long


class PaintProbe(anywidget.AnyWidget):
    """An invisible widget that tells the kernel when the browser has painted it (put it in a box).

    `when_painted(callback)` runs `callback` once: at the first paint of a view of the probe, or after
    `fallback_s` of the kernel's event loop where no page shows it, or at once where no event loop runs
    (a script). Widgets use it to appear at once and send their slow parts right after.

        >>> probe = PaintProbe()
        >>> probe.when_painted(lambda: print("painted"))  # no event loop here: at once
        painted
    """

    _esm = traitlets.Unicode(read_asset("paint_probe.js")).tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._waiting: List[Callable[[], None]] = []
        self.painted_at: Optional[float] = None  # time.perf_counter() when a page first reported its paint
        self.on_msg(self._on_message)

    fallback_s = PAINT_FALLBACK_S

    def when_painted(self, callback: Callable[[], None]) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            callback()
            return
        self._waiting.append(callback)
        loop.call_later(self.fallback_s, self._run_waiting)

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("event") == "painted":
            if self.painted_at is None:
                self.painted_at = time.perf_counter()
            self._run_waiting()

    def _run_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback()


class LazyFigure:
    """A LiveFigure made on its first `show()`, inside a fixed `container` box that shows a placeholder
    ("drawing <what> ...") until then.

    `hold()` puts the placeholder back while the figure stays current in Python, `release()` shows the
    figure again: a widget is painted at once with placeholders, its figures follow (see `PaintProbe`).

        >>> lazy = LazyFigure("memory")
        >>> lazy.show([dict(type="bar", x=["a"], y=[1])], {})
        ['create']
        >>> lazy.hold(), lazy.container.children[0] is lazy.placeholder
        (True, True)
        >>> lazy.release(); lazy.container.children[0] is lazy.widget
        True
    """

    def __init__(self, what: str = "the figure") -> None:
        import ipywidgets as w

        self.placeholder = w.HTML(f'<div class="rtk-placeholder" style="color:#6b7280;padding:24px">'
                                  f"{SPINNER}drawing {what} ...</div>")
        self.container = w.VBox([self.placeholder])
        self.live: Optional[LiveFigure] = None
        self.note: Optional[str] = None  # the text shown instead of the figure, if any
        self._held = False

    def show(self, traces: Sequence[dict], layout: dict) -> List[str]:
        if self.live is None:
            self.live = LiveFigure(traces, layout)
            if not self._held:
                self.container.children = [self.live.widget]
            return ["create"]
        written = self.live.show(traces, layout)
        if self.note is not None:
            self.note = None
            if not self._held:
                self.container.children = [self.live.widget]
            return written or ["restore"]
        return written

    def show_note(self, text: str) -> None:
        """Show `text` instead of the figure (the next `show()` brings the figure back), e.g. while there is
        nothing current to draw, so that an old picture is never taken for the current one."""
        import ipywidgets as w

        self.note = text
        self.container.children = [w.HTML(f'<div class="rtk-figure-note" style="color:#6b7280;padding:24px">'
                                          f"{html.escape(text)}</div>")]

    def hold(self) -> bool:
        """Show the placeholder instead of the figure until `release()`; False when there is no figure yet."""
        if self.live is None:
            return False
        self._held = True
        self.container.children = [self.placeholder]
        return True

    def release(self) -> None:
        """Show the figure again (after `hold()`)."""
        self._held = False
        if self.note is not None:
            self.show_note(self.note)
        elif self.live is not None:
            self.container.children = [self.live.widget]

    @property
    def widget(self):
        return self.live.widget if self.live is not None else None

    @property
    def data(self):
        """The traces shown now (empty while a placeholder or a note shows)."""
        return self.live.data if self.live is not None and self.note is None else ()

    @property
    def layout(self):
        return self.live.layout if self.live is not None and self.note is None else None
