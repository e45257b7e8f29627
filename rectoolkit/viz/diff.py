"""Two plans side by side: which tables moved or changed type, and how each rank's bytes changed.

    >>> from rectoolkit.plan.types import ParameterSharding, ShardMetadata
    >>> a = {"t": ParameterSharding("table_wise", ranks=[0], shards=[ShardMetadata.on_rank(0, 0, 0, 10, 4)])}
    >>> b = {"t": ParameterSharding("table_wise", ranks=[1], shards=[ShardMetadata.on_rank(1, 0, 0, 10, 4)])}
    >>> fig = plan_diff_figure(a, b)
    >>> fig.data[0].y.tolist()  # rank 0 loses 160 bytes, rank 1 gains them
    [-160.0, 160.0]
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from rectoolkit.viz.frames import PlanDiff, PlanLike, TablesLike, plan_diff
from rectoolkit.viz.style import OVERFLOW_COLOR, format_bytes, signed_bytes_axis

GAIN_COLOR = "#DC2626"  # a rank that holds more after the change
LOSS_COLOR = "#16A34A"  # a rank that holds less


def plan_diff_traces(diff: PlanDiff) -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout: per-rank weight-byte deltas (bars) and a table of changed tables."""
    ranks = diff.ranks
    delta = ranks["delta_bytes"].to_numpy(dtype=np.float64)
    labels = [f"rank {r}" for r in ranks["rank"]]
    changed = diff.changed
    bars = dict(
        type="bar", name="change in bytes", x=labels, y=delta, xaxis="x", yaxis="y",
        marker=dict(color=[GAIN_COLOR if d > 0 else LOSS_COLOR for d in delta]),
        customdata=[f"{format_bytes(o)} -> {format_bytes(n)}" for o, n in zip(ranks["old_bytes"], ranks["new_bytes"])],
        hovertemplate="%{x}: %{customdata}<extra></extra>",
    )
    cells = [
        list(changed["table"]),
        list(changed["status"]),
        [f"{o} -> {n}" if o != n else str(n) for o, n in zip(changed["old_type"], changed["new_type"])],
        [f"{o} -> {n}" for o, n in zip(changed["old_ranks"], changed["new_ranks"])],
        [format_bytes(b) for b in changed["moved_bytes"]],
    ]
    table = dict(
        type="table", domain=dict(x=[0.0, 1.0], y=[0.0, 0.45]),
        header=dict(values=["table", "status", "sharding type", "ranks", "bytes to move"],
                    fill=dict(color="#E5E7EB"), align="left"),
        cells=dict(values=cells if len(changed) else [["(no table changed)"], [""], [""], [""], [""]], align="left"),
    )
    layout = dict(
        title=dict(text=f"Plan diff: {diff.summary()}"),
        xaxis=dict(domain=[0, 1], anchor="y", type="category"),
        yaxis=dict(domain=[0.58, 1.0], anchor="x", zeroline=True,
                   zerolinecolor=OVERFLOW_COLOR if (delta != 0).any() else "#9CA3AF",
                   **signed_bytes_axis(float(np.abs(delta).max(initial=0)), "bytes (new - old)")),
        showlegend=False, height=520, margin=dict(l=70, r=10, t=60, b=20), plot_bgcolor="white",
    )
    return [bars, table], layout


def plan_diff_figure(old: PlanLike, new: PlanLike, tables: TablesLike = None, diff: Optional[PlanDiff] = None):
    """Bars of each rank's change in weight bytes over a table of what moved (new minus old)."""
    import plotly.graph_objects as go

    diff = diff if diff is not None else plan_diff(old, new, tables)
    traces, layout = plan_diff_traces(diff)
    return go.Figure(data=traces, layout=layout)
