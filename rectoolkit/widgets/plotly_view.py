"""PlotlyView: one plotly figure in a widget, updated in place (Plotly.react) when its figure changes.

The figure travels as JSON, `{"data": [...], "layout": {...}, "config": {...}}` (the synced `figure`), with a
`revision` that grows with every `show()`. The view (widgets/plotly_view.js) draws each revision into the same
plot `<div>` with Plotly.react, so a change updates the plot on the page instead of building a new one, and
it tells the kernel when a revision is on screen (`drawn_revision`, `when_drawn`).

plotly.js is loaded once per page: in JupyterLab, the copy that its plotly renderer extension (installed with
plotly) has already loaded and compiled with the page; elsewhere the first PlotlyView model on a page asks its
kernel (as soon as the page has the model, before any view draws), which sends plotly's own plotly.min.js once.

    >>> view = PlotlyView({"data": [{"type": "bar", "x": ["a"], "y": [1]}], "layout": {}})
    >>> view.revision, view.drawn_revision
    (1, 0)
    >>> view.show({"data": [{"type": "bar", "x": ["a"], "y": [2]}], "layout": {}})
    2
    >>> view.figure["data"][0]["y"], view.figure["config"]["displaylogo"]
    ([2], False)
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict, List, Optional

import anywidget
import traitlets

from rectoolkit.widgets.assets import read_asset

CONFIG = {"displaylogo": False, "responsive": True}
FIGURE_KEYS = ("data", "layout", "config")


@functools.lru_cache(maxsize=1)
def plotly_js() -> bytes:
    """plotly.min.js as the installed plotly package ships it (what a page without plotly.js is sent)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


class PlotlyView(anywidget.AnyWidget):
    """A plotly figure given as a JSON-ready dict (data, layout, optional config); `show(figure)` redraws it.

    `drawn_revision` is the last revision a page reported on screen (0 until then); `when_drawn(callback)`
    runs `callback(seconds)` once the current revision is, with the seconds from its `show()`.
    """

    _esm = traitlets.Unicode(read_asset("plotly_view.js")).tag(sync=True)
    figure = traitlets.Dict().tag(sync=True)
    revision = traitlets.Int(0).tag(sync=True)

    def __init__(self, figure: Dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.drawn_revision = 0
        self.draw_seconds: Optional[float] = None  # show() to on screen, for the last revision drawn
        self.first_drawn_at: Optional[float] = None  # time.perf_counter() when a page first showed a revision
        self._shown_at: Dict[int, float] = {}
        self._waiting: List[Callable[[float], None]] = []
        self.on_msg(self._on_message)
        self.show(figure)

    def show(self, figure: Dict[str, Any]) -> int:
        """Send `figure` to the page (one message) and return its revision."""
        unknown = sorted(set(figure) - set(FIGURE_KEYS))
        if unknown or "data" not in figure:
            raise ValueError(f"PlotlyView: a figure is a dict with 'data' and optionally 'layout' and 'config'; "
                             f"got keys {sorted(figure)}")
        full = {"data": list(figure["data"]), "layout": dict(figure.get("layout") or {}),
                "config": {**CONFIG, **(figure.get("config") or {})}}
        with self.hold_sync():  # the figure and its revision arrive together
            self.figure = full
            self.revision += 1
        self._shown_at = {self.revision: time.perf_counter()}
        return self.revision

    def when_drawn(self, callback: Callable[[float], None]) -> None:
        """Run `callback(seconds from show() to on screen)` once a page shows the current revision (at once
        if one already does)."""
        if self.drawn_revision >= self.revision:
            callback(self.draw_seconds or 0.0)
            return
        self._waiting.append(callback)

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if not isinstance(content, dict):
            return
        if content.get("event") == "plotly-js?":
            self.send({"event": "plotly-js"}, buffers=[plotly_js()])
        elif content.get("event") == "drawn":
            self._drawn(int(content.get("revision", 0)))

    def _drawn(self, revision: int) -> None:
        if self.first_drawn_at is None:
            self.first_drawn_at = time.perf_counter()
        self.drawn_revision = max(self.drawn_revision, revision)
        if revision != self.revision:
            return  # an older revision; the current one follows
        shown_at: Optional[float] = self._shown_at.pop(revision, None)
        seconds = time.perf_counter() - shown_at if shown_at is not None else 0.0
        self.draw_seconds = seconds
        waiting, self._waiting = self._waiting, []
        for callback in waiting:
            callback(seconds)
