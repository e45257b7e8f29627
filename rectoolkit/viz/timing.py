"""Per-rank estimated step time, split into lookup (compute) and communication, with the slowest rank marked.

    >>> import pandas as pd
    >>> times = pd.DataFrame({"rank": [0, 1], "lookup_ms": [1.0, 2.0], "comm_ms": [0.5, 0.25]})
    >>> fig = rank_time_figure(times)
    >>> [t.name for t in fig.data], fig.layout.title.text
    (['lookup', 'comm'], 'Estimated step time per rank (slowest: rank 1, 2.25 ms)')
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from rectoolkit.viz.style import OVERFLOW_COLOR, component_color, format_ms, pretty_component

EXCLUDED_WORDS = ("total", "step", "rank", "max")
COMM_TOTAL = "comm_ms"  # the planner's report: the sum of its per-collective columns


def time_components(times: pd.DataFrame, components: Optional[Sequence[str]] = None) -> List[str]:
    """The stacked columns: given ones, else every `*_ms` column that is not a total.

    For the planner's report (lookup_fwd_ms, lookup_bwd_ms, one <collective>_ms each, comm_ms, total_ms):
    the lookups and the collectives that take time; comm_ms (their sum) is not stacked again.
    """
    if components is not None:
        missing = [c for c in components if c not in times.columns]
        if missing:
            raise KeyError(f"time DataFrame has no column(s) {missing}; it has {list(times.columns)}")
        return list(components)
    found = [c for c in times.columns if str(c).endswith("_ms") and not any(w in str(c) for w in EXCLUDED_WORDS)]
    if COMM_TOTAL in found and any(c not in (COMM_TOTAL,) and not c.startswith("lookup") for c in found):
        found = [c for c in found if c != COMM_TOTAL and (c.startswith("lookup") or times[c].to_numpy().any())]
    return found


def rank_time_traces(times: pd.DataFrame, components: Optional[Sequence[str]] = None,
                     title: str = "Estimated step time per rank") -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout for the per-rank time bars (stacked)."""
    names = time_components(times, components)
    ranks = times["rank"].to_numpy() if "rank" in times.columns else times.index.to_numpy()
    labels = [f"rank {r}" for r in ranks]
    values = np.array([times[c].to_numpy(dtype=np.float64) for c in names]).reshape(len(names), len(times))
    total = values.sum(axis=0)
    slowest = int(np.argmax(total)) if len(total) else 0
    traces = []
    for index, (name, row) in enumerate(zip(names, values)):
        traces.append(dict(
            type="bar", name=pretty_component(name), x=labels, y=row,
            marker=dict(color=component_color(name, index),
                        line=dict(color=[OVERFLOW_COLOR if i == slowest else "rgba(0,0,0,0)" for i in range(len(row))],
                                  width=2)),
            customdata=[format_ms(v) for v in row],
            hovertemplate="%{x}: %{customdata} " + pretty_component(name) + "<extra></extra>",
        ))
    full_title = f"{title} (slowest: {labels[slowest]}, {format_ms(total[slowest])})" if len(total) else title
    layout = dict(
        title=dict(text=full_title, x=0, xanchor="left"), barmode="stack",
        yaxis=dict(title=dict(text="ms per step"), rangemode="tozero"), xaxis=dict(type="category"),
        margin=dict(l=60, r=10, t=60, b=40), height=340, plot_bgcolor="white",  # legend on the right
    )
    return traces, layout


def rank_time_figure(times: pd.DataFrame, components: Optional[Sequence[str]] = None, backend: str = "plotly"):
    """Stacked bars of each rank's estimated step time (lookup vs communication); the slowest rank outlined."""
    if backend == "matplotlib":
        from rectoolkit.viz.static import rank_time_mpl
        return rank_time_mpl(times, components)
    import plotly.graph_objects as go

    traces, layout = rank_time_traces(times, components)
    return go.Figure(data=traces, layout=layout)
