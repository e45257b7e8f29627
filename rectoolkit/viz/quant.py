"""Memory against error per storage type: the trade-off of quantizing embedding tables, in one picture.

Takes the DataFrame of `rectoolkit.quant.accuracy.quantization_report` (one row per data type: `bytes`,
`relative_error`, ...). Each type is a point: further left is smaller, lower is more exact. The error axis
is logarithmic (fp16 errs ~1e-4, int2 ~0.5); an exact type (fp32, error 0) sits on the bottom edge, marked.

    >>> import pandas as pd
    >>> report = pd.DataFrame({"data_type": ["FP32", "INT8"], "bytes": [25600, 8000],
    ...                        "relative_error": [0.0, 0.01]})
    >>> fig = memory_error_figure(report)
    >>> list(fig.data[0].text), fig.layout.xaxis.ticktext[-1]
    (['FP32 (exact)', 'INT8'], '32 KiB')
"""

from __future__ import annotations

from typing import List, Tuple

import numpy as np
import pandas as pd

from rectoolkit.viz.style import bytes_axis, format_bytes, rank_color

REQUIRED = ("data_type", "bytes", "relative_error")


def memory_error_traces(report: pd.DataFrame) -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout: one labelled point per data type (bytes across, relative error up)."""
    missing = [c for c in REQUIRED if c not in report.columns]
    if missing:
        raise KeyError(f"the report has no column(s) {missing}; pass quantization_report(...)'s DataFrame "
                       f"(it has {list(report.columns)})")
    sizes = report["bytes"].to_numpy(dtype=float)
    errors = report["relative_error"].to_numpy(dtype=float)
    nonzero = errors[errors > 0]
    floor = float(nonzero.min()) / 10 if nonzero.size else 1e-6  # where an exact type is drawn
    shown = np.where(errors > 0, errors, floor)
    labels = [f"{t} (exact)" if e == 0 else str(t) for t, e in zip(report["data_type"], errors)]
    hover = [f"{t}: {format_bytes(b)}, relative error {e:.3g}" for t, b, e in zip(report["data_type"], sizes, errors)]
    traces = [dict(
        type="scatter", mode="markers+text+lines", x=sizes, y=shown, text=labels, textposition="top right",
        marker=dict(size=12, color=[rank_color(i) for i in range(len(report))]), line=dict(color="#CBD5E1", dash="dot"),
        hovertext=hover, hoverinfo="text", showlegend=False,
    )]
    layout = dict(
        title=dict(text="Memory vs error per storage type", x=0, xanchor="left"),
        xaxis=bytes_axis(float(sizes.max()) * 1.15, title="table bytes", range=[0, float(sizes.max()) * 1.15]),
        yaxis=dict(title=dict(text="relative error of pooled outputs (log)"), type="log",
                   range=[np.log10(floor) - 0.5, np.log10(max(float(shown.max()), floor)) + 0.5]),
        height=380, margin=dict(l=70, r=20, t=50, b=50), plot_bgcolor="white",
    )
    return traces, layout


def memory_error_figure(report: pd.DataFrame):
    """Bytes against relative error, one point per storage type (see the module docstring)."""
    import plotly.graph_objects as go

    traces, layout = memory_error_traces(report)
    return go.Figure(data=traces, layout=layout)
