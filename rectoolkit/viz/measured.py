"""Estimated against measured step time, per plan and rank (rectoolkit.planner.measure_plans' `ranks` frame).

    >>> import pandas as pd
    >>> ranks = pd.DataFrame({"plan": ["a", "a", "b", "b"], "rank": [0, 1, 0, 1],
    ...                       "est_step_ms": [10.0, 10.0, 20.0, 20.0], "step_ms": [12.0, 11.0, 19.0, 18.5]})
    >>> fig = measured_vs_estimated_figure(ranks)
    >>> [t.name for t in fig.data]
    ['estimated', 'measured']
    >>> list(fig.data[1].y)
    [12.0, 11.0, 19.0, 18.5]
"""

from __future__ import annotations

from typing import Tuple

import pandas as pd

from rectoolkit.viz.style import format_ms

ESTIMATED_COLOR, MEASURED_COLOR = "#93C5FD", "#1D4ED8"


def measured_vs_estimated_traces(ranks: pd.DataFrame, measured: str = "step_ms",
                                 estimated: str = "est_step_ms") -> Tuple[list, dict]:
    """Plotly traces and layout: per (plan, rank), the estimate beside the measurement (grouped bars)."""
    missing = [c for c in ("plan", "rank", measured, estimated) if c not in ranks.columns]
    if missing:
        raise KeyError(f"measured_vs_estimated: the frame lacks column(s) {missing}; pass measure_plans(...).ranks")
    labels = [[str(p) for p in ranks["plan"]], [f"rank {r}" for r in ranks["rank"]]]
    traces = []
    for name, column, color in (("estimated", estimated, ESTIMATED_COLOR), ("measured", measured, MEASURED_COLOR)):
        values = ranks[column].astype(float).tolist()
        traces.append(dict(type="bar", name=name, x=labels, y=values, marker=dict(color=color),
                           customdata=[format_ms(v) for v in values],
                           hovertemplate="%{x}: %{customdata} " + name + "<extra></extra>"))
    layout = dict(title=dict(text="Step time: estimated vs measured, per plan and rank", y=0.97),
                  barmode="group", yaxis=dict(title=dict(text="ms per step"), rangemode="tozero"),
                  legend=dict(orientation="h", y=-0.25, x=0), margin=dict(l=60, r=10, t=50, b=80), height=360,
                  plot_bgcolor="white")
    return traces, layout


def measured_vs_estimated_figure(ranks: pd.DataFrame, measured: str = "step_ms", estimated: str = "est_step_ms"):
    """Grouped bars: the cost model's step estimate beside the measured step time of every plan and rank."""
    import plotly.graph_objects as go

    traces, layout = measured_vs_estimated_traces(ranks, measured, estimated)
    return go.Figure(data=traces, layout=layout)
