"""Training runs: live curves (loss, AUC, samples/s, NE, calibration) and measured-vs-estimated overlays per rank.

    >>> import pandas as pd
    >>> metrics = pd.DataFrame({"step": [1, 2, 3], "loss": [0.7, 0.6, 0.5], "auc": [0.5, 0.6, 0.7],
    ...                         "samples_per_s": [900.0, 1000.0, 1100.0]})
    >>> fig = training_curves_figure(metrics)
    >>> [t.name for t in fig.data], fig.data[0].y.tolist()
    (['loss', 'AUC', 'samples/s', 'NE (window)', 'calibration (window)'], [0.7, 0.6, 0.5])
"""

from __future__ import annotations

from typing import List, Mapping, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from rectoolkit.viz.frames import total_matrix
from rectoolkit.viz.style import COMPONENT_COLORS, bytes_axis, format_bytes

# rectoolkit.train reports window_ne / window_calibration from its RecMetricModule (rectoolkit.metrics)
CURVES = (("loss", "loss", "#EF4444"), ("auc", "AUC", "#10B981"), ("samples_per_s", "samples/s", "#3B82F6"),
          ("window_ne", "NE (window)", "#8B5CF6"), ("window_calibration", "calibration (window)", "#F59E0B"))

NO_STEP_YET = "no step reported yet: the curves start with the workers' first report"

MetricsLike = Union[pd.DataFrame, Sequence[Mapping[str, float]]]


def metrics_frame(metrics: MetricsLike) -> pd.DataFrame:
    """Metrics records -> one row per step, averaged over ranks.

    rectoolkit.train reports global values on every rank (loss all-reduced, samples/s of the whole job), so
    the mean over ranks is that value; per-rank numbers average out.
    """
    frame = metrics if isinstance(metrics, pd.DataFrame) else pd.DataFrame(list(metrics))
    if frame.empty:
        return pd.DataFrame(columns=["step"] + [c for c, _, _ in CURVES])
    if "step" not in frame.columns:
        frame = frame.assign(step=np.arange(1, len(frame) + 1))
    if "rank" in frame.columns:
        how = {c: "mean" for c, _, _ in CURVES if c in frame.columns}
        frame = frame.groupby("step", as_index=False).agg(how)
    return frame.sort_values("step").reset_index(drop=True)


def training_curves_traces(metrics: MetricsLike, title: str = "Training") -> Tuple[List[dict], dict]:
    """Stacked panels sharing the step axis: loss, AUC, samples/s, NE, calibration (missing columns stay empty).

    With no metrics yet the panels are blank and say that no step has been reported:

        >>> training_curves_traces([])[1]["annotations"][0]["text"] == NO_STEP_YET
        True
    """
    frame = metrics_frame(metrics)
    traces, layout = [], dict(
        title=dict(text=title), showlegend=False, height=120 * len(CURVES) + 100, margin=dict(l=60, r=10, t=50, b=40),
        plot_bgcolor="white",
    )
    panels = len(CURVES)
    for index, (column, label, color) in enumerate(CURVES):
        axis = "" if index == 0 else str(index + 1)
        y = frame[column].to_numpy(dtype=np.float64) if column in frame.columns else np.array([])
        x = frame["step"].to_numpy() if column in frame.columns else np.array([])
        traces.append(dict(type="scatter", mode="lines+markers", name=label, x=x, y=y, xaxis="x" + axis,
                           yaxis="y" + axis, line=dict(color=color), marker=dict(size=4)))
        top = 1.0 - index / panels
        layout["yaxis" + axis] = dict(domain=[top - 1.0 / panels + 0.06, top], title=dict(text=label),
                                      anchor="x" + axis)
        layout["xaxis" + axis] = dict(anchor="y" + axis, matches=None if index == 0 else "x",
                                      showticklabels=index == panels - 1,
                                      title=dict(text="step") if index == panels - 1 else None)
    if frame.empty:  # before the first report: say so, instead of empty axes from -1 to 6
        for name in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
            layout[name].update(showticklabels=False, zeroline=False, showgrid=False)
        layout["annotations"] = [dict(text=NO_STEP_YET, xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False,
                                      font=dict(size=14, color="#6b7280"))]
    return traces, layout


def training_curves_figure(metrics: MetricsLike, title: str = "Training"):
    """Loss, AUC, samples/s, NE and calibration against step, one panel each."""
    import plotly.graph_objects as go

    traces, layout = training_curves_traces(metrics, title)
    return go.Figure(data=traces, layout=layout)


def per_rank(values: Union[Sequence[float], np.ndarray, Mapping[str, np.ndarray]]) -> np.ndarray:
    """A per-rank vector from a vector, one [W, W] matrix (bytes each rank sends: row sums) or a dict of them."""
    if isinstance(values, Mapping):
        values = total_matrix(values)
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 2:
        return array.sum(axis=1)
    if array.ndim != 1:
        raise ValueError(f"expected a per-rank vector or a [W, W] matrix, got shape {array.shape}")
    return array


def measured_vs_estimated_traces(estimated, measured, quantity: str = "bytes sent per step",
                                 unit: str = "bytes") -> Tuple[List[dict], dict]:
    """Grouped bars per rank: the planner's estimate beside the measured value, ratio in the hover."""
    est, meas = per_rank(estimated), per_rank(measured)
    if est.shape != meas.shape:
        raise ValueError(f"estimated has {est.shape[0]} ranks but measured has {meas.shape[0]}")
    labels = [f"rank {r}" for r in range(len(est))]
    fmt = format_bytes if unit == "bytes" else (lambda v: f"{v:.3g} {unit}")
    ratio = [f"{m / e:.3f}x the estimate" if e else "no estimate" for e, m in zip(est, meas)]
    traces = [
        dict(type="bar", name="estimated", x=labels, y=est, marker=dict(color=COMPONENT_COLORS["estimated"]),
             customdata=[fmt(v) for v in est], hovertemplate="%{x} estimated %{customdata}<extra></extra>"),
        dict(type="bar", name="measured", x=labels, y=meas, marker=dict(color=COMPONENT_COLORS["measured"]),
             customdata=[f"{fmt(v)} ({r})" for v, r in zip(meas, ratio)],
             hovertemplate="%{x} measured %{customdata}<extra></extra>"),
    ]
    layout = dict(
        title=dict(text=f"Measured vs estimated:<br>{quantity}", x=0, xanchor="left", font=dict(size=14)),
        barmode="group",
        yaxis=(bytes_axis(max(float(np.max(est, initial=0)), float(np.max(meas, initial=0))) * 1.05)
               if unit == "bytes" else dict(title=dict(text=unit))),
        xaxis=dict(type="category"),
        # legend under the bars: two of these charts stand side by side, each needs its own width
        legend=dict(orientation="h", y=-0.15, yanchor="top", x=0),
        height=340, width=460, margin=dict(l=70, r=10, t=70, b=70), plot_bgcolor="white",
    )
    return traces, layout


def measured_vs_estimated_figure(estimated, measured, quantity: str = "bytes sent per step", unit: str = "bytes"):
    """Estimated and measured values per rank side by side (vectors, [W, W] matrices or dicts of matrices)."""
    import plotly.graph_objects as go

    traces, layout = measured_vs_estimated_traces(estimated, measured, quantity, unit)
    return go.Figure(data=traces, layout=layout)


def comparison_frame(estimated, measured) -> pd.DataFrame:
    """Per rank: estimated, measured, and measured / estimated."""
    est, meas = per_rank(estimated), per_rank(measured)
    ratio = np.divide(meas, est, out=np.full_like(meas, np.nan), where=est != 0)
    return pd.DataFrame({"rank": np.arange(len(est)), "estimated": est, "measured": meas, "ratio": ratio})
