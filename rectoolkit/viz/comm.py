"""Rank x rank communication: bytes each rank sends to each other rank per step, per collective and in total.

Matrices are [source, destination], as `rectoolkit.plan.traffic.step_traffic` returns them.

    >>> import numpy as np
    >>> fig = comm_matrix_figure({"input_dist": np.array([[0, 32], [0, 32]]), "output_dist": np.array([[0, 0], [32, 32]])})
    >>> fig.data[0].z.tolist()  # total of both collectives
    [[0.0, 32.0], [32.0, 64.0]]
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

import numpy as np

from rectoolkit.viz.frames import total_matrix
from rectoolkit.viz.style import bytes_axis, format_bytes

TOTAL = "total"
MAX_TEXT_RANKS = 6  # write the bytes in each cell up to this many ranks (the hover always has them)


def comm_options(matrices: Mapping[str, np.ndarray], keep_empty: bool = False) -> Dict[str, np.ndarray]:
    """"total" first, then every collective (all-zero ones dropped unless keep_empty)."""
    options = {TOTAL: total_matrix(matrices)}
    for name, matrix in matrices.items():
        matrix = np.asarray(matrix, dtype=np.float64)
        if keep_empty or matrix.any():
            options[name] = matrix
    return options


def _cell_text(matrix: np.ndarray) -> List[List[str]]:
    return [[format_bytes(v) if v else "" for v in row] for row in matrix]


def comm_matrix_traces(matrices: Mapping[str, np.ndarray], collective: str = TOTAL) -> Tuple[List[dict], dict]:
    """Plotly trace dict and layout of one heatmap: the chosen collective (or the total)."""
    options = comm_options(matrices, keep_empty=True)
    if collective not in options:
        raise KeyError(f"no collective {collective!r}; choose one of {list(options)}")
    matrix = options[collective]
    world_size = matrix.shape[0]
    labels = [str(r) for r in range(world_size)]
    text = _cell_text(matrix)
    # the colour range always starts at 0, so equal traffic everywhere is one colour with readable ticks
    top = float(matrix.max()) if matrix.size and matrix.max() > 0 else 1.0
    trace = dict(
        type="heatmap", z=matrix, x=labels, y=labels, text=text, colorscale="Viridis", zmin=0, zmax=top,
        texttemplate="%{text}" if world_size <= MAX_TEXT_RANKS else None, textfont=dict(size=10),
        hovertemplate="rank %{y} -> rank %{x}: %{text}<extra>" + collective + "</extra>",
        colorbar=bytes_axis(top), xgap=1 if world_size <= 32 else 0, ygap=1 if world_size <= 32 else 0,
    )
    off_diag = float(matrix.sum() - np.trace(matrix))
    layout = dict(
        title=dict(text=f"Bytes per step, {collective}<br><sub>{format_bytes(off_diag)} across links</sub>",
                   x=0, xanchor="left"),
        xaxis=dict(title=dict(text="destination rank"), type="category", side="bottom"),
        yaxis=dict(title=dict(text="source rank"), type="category", autorange="reversed"),
        height=max(350, min(730, 170 + 34 * world_size)),
        width=max(380, min(760, 200 + 34 * world_size)),
        margin=dict(l=60, r=10, t=80, b=50),  # room for the two-line title above the cells
    )
    return [trace], layout


def comm_matrix_figure(matrices: Mapping[str, np.ndarray], collective: str = TOTAL,
                       with_menu: bool = True, backend: str = "plotly"):
    """Heatmap of bytes sent from each rank (rows) to each rank (columns) in one step.

    Shows the total by default; with_menu adds a dropdown to switch between the collectives (it works in a
    plain HTML export too, no kernel needed).
    """
    if backend == "matplotlib":
        from rectoolkit.viz.static import comm_matrix_mpl
        return comm_matrix_mpl(matrices, collective)
    import plotly.graph_objects as go

    traces, layout = comm_matrix_traces(matrices, collective)
    options = comm_options(matrices)
    if with_menu and len(options) > 1:
        buttons = []
        for name, matrix in options.items():
            off_diag = float(matrix.sum() - np.trace(matrix))
            buttons.append(dict(
                label=name, method="update",
                args=[{"z": [matrix], "text": [_cell_text(matrix)]},
                      {"title.text": f"Bytes per step, {name}<br><sub>{format_bytes(off_diag)} across links</sub>"}],
            ))
        active = list(options).index(collective) if collective in options else 0
        # the menu sits on the right of the top margin, the title on its left: they never overlap
        layout["updatemenus"] = [dict(buttons=buttons, active=active, x=1.0, xanchor="right", y=1.0, yanchor="bottom",
                                      pad=dict(b=8))]
        layout["margin"] = dict(l=60, r=10, t=90, b=50)
        layout["width"] = max(520, layout["width"])
    return go.Figure(data=traces, layout=layout)


def comm_summary(matrices: Mapping[str, np.ndarray]) -> "object":
    """A DataFrame: per collective, total bytes, bytes across links, and the busiest sender."""
    import pandas as pd

    rows = []
    for name, matrix in comm_options(matrices, keep_empty=True).items():
        off = matrix - np.diag(np.diag(matrix))
        sent = off.sum(axis=1)
        rows.append({
            "collective": name,
            "bytes": float(matrix.sum()),
            "bytes_across_links": float(off.sum()),
            "busiest_sender": int(np.argmax(sent)) if sent.any() else None,
            "busiest_sender_bytes": float(sent.max()) if sent.size else 0.0,
        })
    return pd.DataFrame(rows)
