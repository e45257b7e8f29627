"""The HTML text the PlanExplorer shows beside its figures: tables, the error box, the status line, the Measure
tab's note. Plain functions from report objects to strings, so that tests read them without a browser:

    >>> import pandas as pd
    >>> html_table(pd.DataFrame({"table": ["t0"], "rows": [1000]}), ["table"])[:40]
    '<div style="max-height:380px;overflow:au'
    >>> "No plan:" in error_box("t3 does not fit")
    True
"""

from __future__ import annotations

import html
from typing import Any, List

import numpy as np

from rectoolkit.viz.comm import TOTAL, comm_options
from rectoolkit.viz.style import format_bytes, humanize


def html_table(frame, columns: List[str], max_height_px: int = 380) -> str:
    """A small scrollable HTML table (faster than DataFrame.to_html for a redraw on every click)."""
    def cell(value: Any, column: str) -> str:
        if isinstance(value, list) and len(value) > 8:
            return html.escape(f"{value[:4]} ... ({len(value)} ranks)")
        return html.escape(humanize(value, column))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(v, c)}</td>" for v, c in zip(row, columns)) + "</tr>"
                   for row in frame[columns].itertuples(index=False, name=None))
    return (f'<div style="max-height:{max_height_px}px;overflow:auto"><table class="rtk-choices" '
            'style="border-collapse:collapse;font-size:12px"><thead style="position:sticky;top:0;background:#f3f4f6">'
            f"<tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
            "<style>.rtk-choices td,.rtk-choices th{border:1px solid #e5e7eb;padding:2px 6px;text-align:left}</style>")


def error_box(text: str) -> str:
    """The red box that says why there is no plan (or why an action failed)."""
    return ('<div class="rtk-plan-error" style="border:1px solid #fecaca;background:#fef2f2;color:#991b1b;'
            'padding:8px;border-radius:6px;white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px">'
            f"<b>No plan:</b> {html.escape(text)}</div>")


def forced_label(settings) -> str:
    """The line under the controls: the forced sharding types and the hand moves on the board."""
    forced = ", ".join(f"{t}={k}" for t, k in sorted(settings.forced.items())) or "none"
    moves = len(settings.moves)
    return (f"<small>forced types: {html.escape(forced)}"
            f"{f'; {moves} hand move(s) on the board' if moves else ''}</small>")


def status_html(result, settings, num_tables: int) -> str:
    """The status line above the controls: tables and ranks, peak memory, slowest rank, bytes across links."""
    if not result.ok:
        return error_box(result.error or "no plan")
    pieces = [f"<b>{num_tables} tables on {settings.world_size} ranks</b>"]
    if result.memory is not None:
        pieces.append(memory_summary(result.memory))
    summary = getattr(result.report, "summary", None) or {}
    if "max_time_ms" in summary:
        pieces.append(f"slowest rank {summary['slowest_rank']}: {summary['max_time_ms']:.3f} ms per step")
    if result.comm is not None:
        options = comm_options(result.comm)
        matrix = options[TOTAL]
        pieces.append(f"{format_bytes(float(matrix.sum() - np.trace(matrix)))} across links per step")
    notes = "".join(f"<br><small>{html.escape(n)}</small>" for n in result.notes)
    return ('<div class="rtk-status" style="padding:6px;border-radius:6px;background:#f0fdf4;'
            'border:1px solid #bbf7d0">' + " &middot; ".join(pieces) + notes + "</div>")


def memory_summary(memory) -> str:
    """Peak memory of the busiest rank, of the capacity, and how many ranks are over it."""
    from rectoolkit.viz.memory import memory_stacks

    from rectoolkit.viz.memory import primary_memory

    _, _, values, cap, overflow = memory_stacks(memory)
    used_col, _, kind = primary_memory(memory)
    used = memory[used_col].to_numpy(dtype=float) if used_col else values.sum(axis=0)
    peak = float(used.max()) if used.size else 0.0
    text = f"peak {kind} {format_bytes(peak)}"
    if np.isfinite(cap).any():
        text += f" of {format_bytes(float(np.nanmax(cap)))}"
    if overflow.any():
        text += f' <span style="color:#b91c1c">({int((overflow > 0).sum())} rank(s) over capacity)</span>'
    return text


def measure_note(profile, measurements) -> str:
    """The Measure tab's text: the time terms the estimates use, and the measured table once a run is done."""
    if profile is None:
        terms = ("<b>Time terms:</b> TorchRec's bandwidth-only defaults (no calibration profile; make one with "
                 "<code>python -m rectoolkit.planner.calibrate</code> and pass <code>profile=\"default\"</code>)")
    else:
        rows = "".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in profile.summary_rows())
        where = profile.machine.get("host", "?")
        terms = f"<b>Calibration profile</b> (measured on {html.escape(str(where))}):<ul>{rows}</ul>"
    if measurements is None:
        return ("Measure runs the current plan (and the pinned one) for a few steps on local "
                f"CPU workers and shows measured beside estimated step time.<br>{terms}")
    info = measurements.info
    columns = [c for c in ("plan", "est_step_ms", "est_now_ms", "step_ms", "cpu_ms") if c in measurements.plans]
    table = html_table(measurements.plans, columns)
    probe = info.get("load_probe_before")
    alone = probe.get("factor_alone") if probe else None
    load = (f"; load factor {probe['factor']:.2f}: a synthetic step took that many times its work in wall time"
            + (f", {alone:.2f} with one rank working" if alone is not None else "")
            + " (est_now_ms = est_step_ms at that load, between the two by how busy the plan keeps the other "
            "ranks: other work shares the cores)" if probe else "")
    return (f"{table}<small>{info['world_size']} ranks, batch {info['batch_size']} per rank, "
            f"load average {info['load_average_before'][0]} before the run{load}</small>"
            f"<br>{terms}")
