"""Step time against memory per rank for each sharding group size: the trade of 2D parallelism in one picture.

Takes the DataFrame of `rectoolkit.planner.two_dimensional.compare_sharding_group_sizes` (one row per group size).
Each size whose tables fit is a point: further left holds less of the tables per rank, lower runs a step faster;
a grey segment under each point marks its group's own step, so the gap up to the point is what the sync adds per
step. Sizes whose tables do not fit are named in the title.

    >>> import pandas as pd
    >>> frame = pd.DataFrame({"sharding_group_size": [1, 2, 4], "replicas": [4, 2, 1], "fits": [False, True, True],
    ...                       "step_ms": [None, 3.0, 2.0], "group_step_ms": [None, 1.0, 2.0],
    ...                       "max_memory_bytes": [None, 2048.0, 1024.0]})
    >>> fig = two_dimensional_figure(frame)
    >>> list(fig.data[1].text), fig.layout.title.text
    (['G=2 (2 replicas)', 'G=4 (1 replica)'], 'Step time vs memory per rank by sharding group size (G=1 does not fit)')
"""

from __future__ import annotations

from typing import List, Tuple

import pandas as pd

from rectoolkit.viz.style import bytes_axis, component_color, format_bytes, format_ms, rank_color

REQUIRED = ("sharding_group_size", "replicas", "fits", "step_ms", "group_step_ms", "max_memory_bytes")


def two_dimensional_traces(frame: pd.DataFrame) -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout (see the module docstring)."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        raise KeyError(f"the frame has no column(s) {missing}; pass compare_sharding_group_sizes(...)'s DataFrame "
                       f"(it has {list(frame.columns)})")
    fits = frame[frame["fits"].astype(bool)]
    if fits.empty:
        raise ValueError("no sharding group size fits: every row of the frame has fits=False (see its 'why' column)")
    sizes = [int(g) for g in fits["sharding_group_size"]]
    memory = fits["max_memory_bytes"].to_numpy(dtype=float)
    step, group = fits["step_ms"].to_numpy(dtype=float), fits["group_step_ms"].to_numpy(dtype=float)
    labels = [f"G={g} ({r} replica{'s' if r != 1 else ''})" for g, r in zip(sizes, fits["replicas"].astype(int))]
    hover = [f"{label}: step {format_ms(s)} (group {format_ms(gs)} + sync {format_ms(s - gs)}), "
             f"{format_bytes(m)} per rank" for label, s, gs, m in zip(labels, step, group, memory)]
    gaps = dict(type="scatter", mode="lines", showlegend=False, hoverinfo="skip",
                x=[v for m in memory for v in (m, m, None)], y=[v for s, g in zip(step, group) for v in (g, s, None)],
                line=dict(color=component_color("estimated"), width=6))
    points = dict(type="scatter", mode="markers+text", x=memory, y=step, text=labels, textposition="top right",
                  marker=dict(size=12, color=[rank_color(i) for i in range(len(fits))]), hovertext=hover,
                  hoverinfo="text", showlegend=False)
    left_out = [int(g) for g in frame.loc[~frame["fits"].astype(bool), "sharding_group_size"]]
    title = "Step time vs memory per rank by sharding group size"
    if left_out:
        title += f" ({', '.join(f'G={g}' for g in left_out)} {'does' if len(left_out) == 1 else 'do'} not fit)"
    layout = dict(
        title=dict(text=title, x=0, xanchor="left"),
        xaxis=bytes_axis(float(memory.max()) * 1.2, title="largest memory of a rank",
                         range=[0, float(memory.max()) * 1.2]),
        yaxis=dict(title=dict(text="estimated step (ms); grey: the group's own step"), rangemode="tozero"),
        height=380, margin=dict(l=70, r=20, t=50, b=50), plot_bgcolor="white",
    )
    return [gaps, points], layout


def two_dimensional_figure(frame: pd.DataFrame):
    """Estimated step against memory per rank, one point per sharding group size (see the module docstring)."""
    import plotly.graph_objects as go

    traces, layout = two_dimensional_traces(frame)
    return go.Figure(data=traces, layout=layout)
