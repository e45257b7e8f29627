"""Per-rank memory as stacked bars (weights, optimizer state, buffers, dense) against each rank's capacity.

The part of a bar above its rank's capacity is drawn in red.

    >>> import pandas as pd
    >>> mem = pd.DataFrame({"rank": [0, 1], "weights_bytes": [60, 30], "optimizer_bytes": [60, 30],
    ...                     "capacity_bytes": [100, 100]})
    >>> fig = memory_figure(mem)
    >>> [t.name for t in fig.data]
    ['weights', 'optimizer', 'over capacity', 'capacity']
    >>> fig.data[2].y.tolist()  # rank 0 is 20 bytes over
    [20.0, 0.0]
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from rectoolkit.viz.style import (CAPACITY_COLOR, OVERFLOW_COLOR, bytes_axis, component_color, format_bytes,
                                  pretty_component)

TINY_SHARE = 0.05  # below this share of capacity the axis follows the usage, with a note, not the capacity

# Parts of a rank's memory, in stacking order. The planner's report (rectoolkit.planner.PlanReport.memory)
# names them without a suffix; other tables may use "<part>_bytes".
KNOWN_COMPONENTS = ("weights", "optimizer", "gradients", "buffers", "buffer", "input_buffer", "output_buffer",
                    "input_buffers", "output_buffers", "dense")
EXCLUDED_WORDS = ("capacity", "total", "free", "cap", "over", "limit", "available", "rank", "hbm", "ddr")


def memory_components(memory: pd.DataFrame, components: Optional[Sequence[str]] = None) -> List[str]:
    """The stacked columns: given ones; else the report's parts (weights, optimizer, ...) if present; else
    every `*_bytes` column that is not a capacity, total or HBM/DDR split."""
    if components is not None:
        missing = [c for c in components if c not in memory.columns]
        if missing:
            raise KeyError(f"memory DataFrame has no column(s) {missing}; it has {list(memory.columns)}")
        return list(components)
    bare = [c for c in KNOWN_COMPONENTS if c in memory.columns]
    if bare:
        return bare
    found = [c for c in memory.columns if str(c).endswith("_bytes") and not any(w in str(c) for w in EXCLUDED_WORDS)]
    order = {name: i for i, name in enumerate(KNOWN_COMPONENTS)}
    return sorted(found, key=lambda c: order.get(str(c)[: -len("_bytes")], len(order)))


def primary_memory(memory: pd.DataFrame) -> Tuple[Optional[str], Optional[str], str]:
    """(used column, capacity column, label) of the memory that limits the plan.

    For the planner's report: HBM when any rank has HBM capacity (cuda), else host memory (DDR, cpu).
    """
    if "hbm_cap_bytes" in memory.columns and float(memory["hbm_cap_bytes"].max()) > 0:
        return "hbm_bytes", "hbm_cap_bytes", "HBM"
    if "ddr_cap_bytes" in memory.columns:
        return "ddr_bytes", "ddr_cap_bytes", "host memory"
    for name in ("capacity_bytes", "hbm_capacity_bytes", "capacity"):
        if name in memory.columns:
            return None, name, "memory"
    return None, None, "memory"


def _capacity_column(memory: pd.DataFrame, capacity: Optional[str]) -> Optional[str]:
    return capacity if capacity is not None else primary_memory(memory)[1]


def _ranks(memory: pd.DataFrame) -> np.ndarray:
    return memory["rank"].to_numpy() if "rank" in memory.columns else memory.index.to_numpy()


def memory_stacks(memory: pd.DataFrame, components: Optional[Sequence[str]] = None,
                  capacity: Optional[str] = None) -> Tuple[np.ndarray, List[str], np.ndarray, np.ndarray, np.ndarray]:
    """(ranks, component names, [component x rank] bytes, capacity per rank (nan if none), overflow per rank)."""
    names = memory_components(memory, components)
    values = np.array([memory[c].to_numpy(dtype=np.float64) for c in names]).reshape(len(names), len(memory))
    cap_col = _capacity_column(memory, capacity)
    cap = memory[cap_col].to_numpy(dtype=np.float64) if cap_col else np.full(len(memory), np.nan)
    used_col = primary_memory(memory)[0] if capacity is None else None
    # with UVM kernels part of the stack lives in host memory: the limiting memory's own total decides overflow
    used = memory[used_col].to_numpy(dtype=np.float64) if used_col in memory.columns else values.sum(axis=0)
    overflow = np.where(np.isnan(cap), 0.0, np.maximum(used - np.nan_to_num(cap), 0.0))
    return _ranks(memory), names, values, cap, overflow


def memory_traces(memory: pd.DataFrame, components: Optional[Sequence[str]] = None,
                  capacity: Optional[str] = None, title: str = "Memory per rank") -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout of the memory figure (stacked with explicit bases, so the overflow bar
    can be laid over the top of each stack from the capacity line up)."""
    ranks, names, values, cap, overflow = memory_stacks(memory, components, capacity)
    if capacity is None and title == "Memory per rank":
        kind = primary_memory(memory)[2]
        title = f"Memory per rank vs {kind} capacity" if kind != "memory" else title
    labels = [f"rank {r}" for r in ranks]
    traces: List[dict] = []
    base = np.zeros(len(ranks))
    total = values.sum(axis=0)
    for index, (name, row) in enumerate(zip(names, values)):
        traces.append(dict(
            type="bar", name=pretty_component(name), x=labels, y=row, base=base.copy(),
            marker=dict(color=component_color(name, index)),
            customdata=[format_bytes(v) for v in row],
            hovertemplate="%{x}: %{customdata} " + pretty_component(name) + "<extra></extra>",
        ))
        base = base + row
    over_text = [f"{format_bytes(o)} over {format_bytes(c)}" if o > 0 else "" for o, c in zip(overflow, cap)]
    traces.append(dict(
        type="bar", name="over capacity", x=labels, y=overflow, base=np.nan_to_num(np.minimum(cap, total)),
        # outline only the ranks that overflow (a zero-height bar with an outline draws a red line at its base)
        marker=dict(color=OVERFLOW_COLOR, opacity=0.85,
                    line=dict(color=OVERFLOW_COLOR, width=[2 if o > 0 else 0 for o in overflow])),
        text=over_text, textposition="outside", customdata=over_text,
        hovertemplate="%{x}: %{customdata}<extra></extra>",
    ))
    traces.append(dict(
        type="scatter", mode="markers", name="capacity", x=labels, y=cap,
        marker=dict(symbol="line-ew", size=40, line=dict(color=CAPACITY_COLOR, width=3)),
        customdata=[format_bytes(c) if np.isfinite(c) else "" for c in cap],
        hovertemplate="%{x} capacity %{customdata}<extra></extra>",
    ))
    peak = float(total.max()) if total.size else 0.0
    largest_cap = float(np.nanmax(cap)) if np.isfinite(cap).any() else 0.0
    annotations = []
    if largest_cap and peak < TINY_SHARE * largest_cap:
        # a 280 MiB stack on a 32 GiB axis looks empty: scale to the usage and say where the capacity is
        top = max(peak, 1.0) * 1.15
        annotations.append(dict(
            text=f"estimated peak {format_bytes(peak)} is {100 * peak / largest_cap:.2g}% of the "
                 f"{format_bytes(largest_cap)} capacity (the capacity line is above this axis)",
            xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom", showarrow=False,
            font=dict(size=11, color="#92400E")))
    else:
        top = max(peak, largest_cap) * 1.08
    layout = dict(
        title=dict(text=title, x=0, xanchor="left"),
        barmode="overlay",
        yaxis=bytes_axis(top, range=[0, top]),
        xaxis=dict(type="category"),
        annotations=annotations,
        margin=dict(l=70, r=10, t=70, b=40),  # the legend stands on the right (never over the title)
        height=360,
        plot_bgcolor="white",
    )
    return traces, layout


def memory_figure(memory: pd.DataFrame, components: Optional[Sequence[str]] = None,
                  capacity: Optional[str] = None, backend: str = "plotly"):
    """Stacked memory bars per rank against each rank's capacity; overflow in red.

    `memory` has a `rank` column (or the rank as index), one `<component>_bytes` column per component and
    optionally `capacity_bytes`. Pick columns explicitly with `components=[...]` and `capacity=...`.
    """
    if backend == "matplotlib":
        from rectoolkit.viz.static import memory_mpl
        return memory_mpl(memory, components, capacity)
    import plotly.graph_objects as go

    traces, layout = memory_traces(memory, components, capacity)
    return go.Figure(data=traces, layout=layout)
