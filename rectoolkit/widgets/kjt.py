"""Teaching widgets for the jagged types: a KJT drawn as keys x batch, and "trace a batch" through shards.

    >>> import torch
    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor(keys=["product", "user"], values=torch.tensor([1, 2, 1, 5, 2, 3, 4, 1]),
    ...                         lengths=torch.tensor([3, 1, 2, 2]))
    >>> view = KJTView(kjt)
    >>> view.select("user", 1)
    'user, sample 1: lengths[3] = 2, offsets[3] = 6, values[6:8] = [4, 1]'
"""

from __future__ import annotations

import html
from typing import List, Optional, Sequence

import ipywidgets as w

from rectoolkit.viz.frames import PlanLike, TablesLike
from rectoolkit.viz.routing import route_matrices, routing_frame, routing_traces
from rectoolkit.viz.style import format_bytes
from rectoolkit.widgets.live_figure import LiveFigure

KEY_COLORS = ["#DBEAFE", "#FEE2E2", "#D1FAE5", "#EDE9FE", "#FEF3C7", "#CFFAFE", "#FCE7F3", "#ECFCCB"]
ALL = "all"

_STYLE = """<style>
.rtk-kjt table {border-collapse: collapse; font-family: ui-monospace, monospace; font-size: 12px; margin: 4px 0;}
.rtk-kjt td, .rtk-kjt th {border: 1px solid #d1d5db; padding: 3px 6px; text-align: center;}
.rtk-kjt th {background: #f3f4f6;}
.rtk-kjt .rtk-hl {outline: 3px solid #111827; outline-offset: -3px; font-weight: 700;}
.rtk-kjt .rtk-dim {opacity: 0.35;}
.rtk-kjt .rtk-label {font-family: system-ui, sans-serif; font-weight: 600; text-align: left; border: none;}
</style>"""


class KJTView(w.VBox):
    """A KeyedJaggedTensor as a keys x batch grid, with its flat values / lengths / offsets underneath.

    Pick a key and a sample to see which slice of `values` is theirs (colours match between the grid and the
    flat arrays). `select(key, sample)` does the same from Python and returns the explanation line.
    """

    def __init__(self, kjt, title: str = "KeyedJaggedTensor") -> None:
        self.kjt = kjt
        self.keys_ = list(kjt.keys())
        self.stride = int(kjt.stride())
        self.values = kjt.values().tolist()
        weights = kjt.weights_or_none()
        self.weights = None if weights is None else [round(float(x), 4) for x in weights.tolist()]
        self.lengths = kjt.lengths().tolist()
        self.offsets = kjt.offsets().tolist()
        self.key_picker = w.Dropdown(options=[ALL] + self.keys_, value=ALL, description="key")
        self.sample_picker = w.Dropdown(options=[ALL] + list(range(self.stride)), value=ALL, description="sample")
        self.picture = w.HTML()
        self.explanation = w.HTML()
        self.key_picker.observe(self._redraw, names="value")
        self.sample_picker.observe(self._redraw, names="value")
        header = w.HTML(f"<b>{html.escape(title)}</b>: keys={self.keys_}, stride (batch size)={self.stride}, "
                        f"{len(self.values)} values")
        super().__init__([header, w.HBox([self.key_picker, self.sample_picker]), self.picture, self.explanation])
        self._redraw()

    def select(self, key: Optional[str], sample: Optional[int]) -> str:
        """Highlight one key and/or sample (None = all); returns the explanation text."""
        self.key_picker.value = ALL if key is None else key
        self.sample_picker.value = ALL if sample is None else sample
        return self.explanation_text

    def _slot(self, key_index: int, sample: int) -> int:
        return key_index * self.stride + sample

    def _selected(self, key_index: int, sample: int) -> bool:
        key, chosen = self.key_picker.value, self.sample_picker.value
        return (key == ALL or key == self.keys_[key_index]) and (chosen == ALL or chosen == sample)

    def _redraw(self, _change=None) -> None:
        focus = self.key_picker.value != ALL or self.sample_picker.value != ALL
        grid = ["<tr><th></th>" + "".join(f"<th>sample {b}</th>" for b in range(self.stride)) + "</tr>"]
        value_owner: List[int] = []
        for k, key in enumerate(self.keys_):
            cells = []
            for b in range(self.stride):
                slot = self._slot(k, b)
                start, end = self.offsets[slot], self.offsets[slot + 1]
                css = ("rtk-hl" if focus and self._selected(k, b) else "rtk-dim" if focus else "")
                weighted = "" if self.weights is None else f"<br>w={self.weights[start:end]}"
                cells.append(f'<td class="{css}" style="background:{KEY_COLORS[k % len(KEY_COLORS)]}">'
                             f"{self.values[start:end]}{weighted}</td>")
                value_owner.extend([slot] * (end - start))
            grid.append(f"<tr><th>{html.escape(key)}</th>{''.join(cells)}</tr>")

        def flat_row(label: str, items: Sequence, slot_of) -> str:
            cells = []
            for i, item in enumerate(items):
                slot = slot_of(i)
                if slot is None:
                    cells.append(f"<td>{item}</td>")
                    continue
                k, b = divmod(slot, self.stride)
                css = ("rtk-hl" if focus and self._selected(k, b) else "rtk-dim" if focus else "")
                cells.append(f'<td class="{css}" style="background:{KEY_COLORS[k % len(KEY_COLORS)]}">{item}</td>')
            return f'<tr><td class="rtk-label">{label}</td>{"".join(cells)}</tr>'

        slots = len(self.lengths)
        flat = [
            flat_row("values", self.values, lambda i: value_owner[i]),
            *([] if self.weights is None else [flat_row("weights", self.weights, lambda i: value_owner[i])]),
            flat_row("lengths", self.lengths, lambda i: i),
            flat_row("offsets", self.offsets, lambda i: i if i < slots else None),
        ]
        self.picture.value = (f'{_STYLE}<div class="rtk-kjt"><table>{"".join(grid)}</table>'
                              f'<table>{"".join(flat)}</table></div>')
        self.explanation_text = self._explain()
        self.explanation.value = f"<code>{html.escape(self.explanation_text)}</code>"

    def _explain(self) -> str:
        key, sample = self.key_picker.value, self.sample_picker.value
        if key == ALL and sample == ALL:
            return (f"lengths has len(keys) x stride = {len(self.keys_)} x {self.stride} = {len(self.lengths)} "
                    f"entries, key-major; offsets = cumulative lengths ({len(self.offsets)} entries)")
        if key != ALL and sample != ALL:
            slot = self._slot(self.keys_.index(key), sample)
            start, end = self.offsets[slot], self.offsets[slot + 1]
            weighted = "" if self.weights is None else f", weights[{start}:{end}] = {self.weights[start:end]}"
            return (f"{key}, sample {sample}: lengths[{slot}] = {self.lengths[slot]}, offsets[{slot}] = {start}, "
                    f"values[{start}:{end}] = {self.values[start:end]}{weighted}")
        if key != ALL:
            k = self.keys_.index(key)
            first, last = self._slot(k, 0), self._slot(k, self.stride - 1)
            start, end = self.offsets[first], self.offsets[last + 1]
            return (f"{key}: lengths[{first}:{last + 1}] = {self.lengths[first:last + 1]}, "
                    f"values[{start}:{end}] = {self.values[start:end]}")
        parts = []
        for k, name in enumerate(self.keys_):
            slot = self._slot(k, sample)
            parts.append(f"{name} -> values[{self.offsets[slot]}:{self.offsets[slot + 1]}]")
        return f"sample {sample}: " + ", ".join(parts)


class BatchTrace(w.VBox):
    """Follow one batch per rank through a sharded embedding collection (no processes are started).

    Choose a feature and a source rank; the Sankey shows the ids going to each shard's owner and the pooled
    rows coming back, and the table lists the ids. `routes` holds every route (a DataFrame).
    """

    def __init__(self, plan: PlanLike, tables: TablesLike, batches: Sequence, local_world_size: Optional[int] = None,
                 is_weighted: bool = False) -> None:
        self.routes = routing_frame(plan, tables, batches, local_world_size, is_weighted)
        self.world_size = len(batches)
        features = list(dict.fromkeys(self.routes["feature"]))
        self.feature_picker = w.Dropdown(options=[ALL] + features, value=ALL, description="feature")
        self.rank_picker = w.Dropdown(options=[ALL] + list(range(self.world_size)), value=ALL, description="from rank")
        self.measure_picker = w.ToggleButtons(options=["bytes", "ids"], value="bytes", description="measure")
        traces, layout = routing_traces(self.routes, self.world_size)
        self.figure = LiveFigure(traces, layout)
        self.table = w.HTML()
        self.summary = w.HTML()
        for picker in (self.feature_picker, self.rank_picker, self.measure_picker):
            picker.observe(self._redraw, names="value")
        super().__init__([w.HBox([self.feature_picker, self.rank_picker, self.measure_picker]),
                          self.figure.widget, self.summary, self.table])
        self._redraw()

    def select(self, feature: Optional[str] = None, source_rank: Optional[int] = None) -> "BatchTrace":
        self.feature_picker.value = ALL if feature is None else feature
        self.rank_picker.value = ALL if source_rank is None else source_rank
        return self

    def visible_routes(self):
        chosen = self.routes
        if self.feature_picker.value != ALL:
            chosen = chosen[chosen.feature == self.feature_picker.value]
        if self.rank_picker.value != ALL:
            chosen = chosen[chosen.source_rank == self.rank_picker.value]
        return chosen

    def _redraw(self, _change=None) -> None:
        feature = None if self.feature_picker.value == ALL else self.feature_picker.value
        rank = None if self.rank_picker.value == ALL else self.rank_picker.value
        traces, layout = routing_traces(self.routes, self.world_size, feature, rank, self.measure_picker.value)
        self.figure.show(traces, layout)
        chosen = self.visible_routes()
        inputs, outputs = route_matrices(chosen, self.world_size)
        self.summary.value = (f"{int(chosen['num_ids'].sum())} ids; input all-to-all {format_bytes(inputs.sum())}, "
                              f"pooled rows back {format_bytes(outputs.sum())}")
        rows = "".join(
            f"<tr><td>{r.source_rank}</td><td>{html.escape(r.feature)}</td><td>{html.escape(r.table)}</td>"
            f"<td>{r.sharding_type}</td><td>{r.shard if r.shard >= 0 else '-'}</td><td>{r.owner_rank}</td>"
            f"<td>{r.rows[0]}:{r.rows[1]}</td><td>{r.ids if r.num_ids <= 16 else str(r.ids[:16])[:-1] + ', ...]'}</td>"
            f"<td>{html.escape(r.returns)}</td></tr>"
            for r in chosen.head(60).itertuples(index=False))
        self.table.value = (
            f'{_STYLE}<div class="rtk-kjt"><table><tr><th>from rank</th><th>feature</th><th>table</th><th>type</th>'
            f"<th>shard</th><th>to rank</th><th>rows</th><th>ids sent</th><th>what comes back</th></tr>{rows}</table></div>")
