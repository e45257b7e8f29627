"""Where every shard lives: each table drawn as its rows x columns rectangle cut into shards coloured by rank,
and a rank x table map of bytes.

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.plan.types import ParameterSharding, ShardMetadata
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> plan = {"t": ParameterSharding("column_wise", ranks=[0, 1], shards=[
    ...     ShardMetadata.on_rank(0, 0, 0, 10, 2), ShardMetadata.on_rank(1, 0, 2, 10, 2)])}
    >>> fig = shard_placement_figure(plan, [t])
    >>> [trace.name for trace in fig.data if trace.showlegend]
    ['rank 0', 'rank 1']
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np
import pandas as pd

from rectoolkit.viz.frames import PlanLike, TablesLike, placement_frame, rank_table_bytes
from rectoolkit.viz.style import REPLICATED_COLOR, bytes_axis, format_bytes, rank_color

CELL = 1.0  # each table gets a CELL x CELL slot; its rectangle is scaled inside it
GAP = 0.5  # room between slots for the two-line label
MIN_SIDE = 0.18  # the smallest drawn side, so tiny tables stay visible


def table_rectangles(placement: pd.DataFrame, columns: Optional[int] = None) -> pd.DataFrame:
    """Where each table's rectangle is drawn: table -> x0, y0 (top-left), width, height, label position.

    Width grows with embedding_dim (linear, relative to the widest table), height with log10(rows), so a
    10M-row table is taller than a 1k-row one without dwarfing it.
    """
    tables = placement.drop_duplicates("table")[["table", "num_embeddings", "embedding_dim"]]
    count = len(tables)
    if count == 0:
        return pd.DataFrame(columns=["table", "x0", "y0", "width", "height", "label_x", "label_y"])
    columns = columns or max(1, math.ceil(math.sqrt(count * 1.6)))
    max_dim = max(1, int(tables["embedding_dim"].max()))
    max_log = max(1.0, math.log10(max(2, int(tables["num_embeddings"].max()))))
    records = []
    for position, (name, rows, dim) in enumerate(tables.itertuples(index=False)):
        slot_col, slot_row = position % columns, position // columns
        width = max(MIN_SIDE, CELL * dim / max_dim)
        height = max(MIN_SIDE, CELL * math.log10(max(2, rows)) / max_log)
        x0 = slot_col * (CELL + GAP) + (CELL - width) / 2
        y0 = -slot_row * (CELL + GAP)  # rows grow downwards, like a matrix
        records.append((name, x0, y0, width, height, slot_col * (CELL + GAP) + CELL / 2, y0 - height - 0.06))
    return pd.DataFrame.from_records(records, columns=["table", "x0", "y0", "width", "height", "label_x", "label_y"])


def shard_placement_traces(placement: pd.DataFrame, world_size: Optional[int] = None,
                           columns: Optional[int] = None) -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout for the placement figure (shared by the figure and the widgets).

    One filled trace per rank (every shard of that rank as a closed polygon, gaps between them), one grey
    trace for replicated (DATA_PARALLEL) tables, one invisible hover trace with a line per shard, one text
    trace with the table labels. Trace count depends only on world_size, so widgets can update in place.
    """
    if world_size is None:
        world_size = int(placement["rank"].max()) + 1 if len(placement) else 1
    rects = table_rectangles(placement, columns)
    # every shard's rectangle, vectorized: the table's box scaled by the shard's row / column range
    box = rects.set_index("table").loc[placement["table"].to_numpy()]
    x0, y0 = box["x0"].to_numpy(), box["y0"].to_numpy()
    width, height = box["width"].to_numpy(), box["height"].to_numpy()
    dims = np.maximum(placement["embedding_dim"].to_numpy(dtype=float), 1)
    num_rows = np.maximum(placement["num_embeddings"].to_numpy(dtype=float), 1)
    left = x0 + width * placement["col_start"].to_numpy() / dims
    right = x0 + width * placement["col_end"].to_numpy() / dims
    top = y0 - height * placement["row_start"].to_numpy() / num_rows
    bottom = y0 - height * placement["row_end"].to_numpy() / num_rows
    ranks = placement["rank"].to_numpy()
    replicated = (placement["sharding_type"] == "data_parallel").to_numpy()
    drawn = ~replicated | (ranks == 0)  # one drawing for all replicas of a data-parallel table

    def polygons(mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        gap = np.full(int(mask.sum()), np.nan)
        xs = np.column_stack([left[mask], right[mask], right[mask], left[mask], left[mask], gap]).ravel()
        ys = np.column_stack([top[mask], top[mask], bottom[mask], bottom[mask], top[mask], gap]).ravel()
        return xs, ys

    per_rank = {rank: polygons(drawn & ~replicated & (ranks == rank)) for rank in range(world_size)}
    rep_x, rep_y = polygons(drawn & replicated)
    hover = placement[drawn]
    hover_x = ((left + right) / 2)[drawn]
    hover_y = ((top + bottom) / 2)[drawn]
    hover_rank = np.where(replicated, -1, ranks)[drawn]
    hover_text = [
        f"<b>{table}</b> shard {shard} on "
        + (f"all {world_size} ranks (replicated)" if kind == "data_parallel" else f"rank {rank}")
        + f"<br>{kind}, {kernel}<br>rows {r0}:{r1}, cols {c0}:{c1}<br>{format_bytes(size)}"
        for table, shard, rank, kind, kernel, r0, r1, c0, c1, size in zip(
            hover["table"], hover["shard"], hover["rank"], hover["sharding_type"], hover["compute_kernel"],
            hover["row_start"], hover["row_end"], hover["col_start"], hover["col_end"], hover["bytes"])
    ]
    traces: List[dict] = []
    for rank in range(world_size):
        traces.append(dict(
            type="scatter", mode="lines", name=f"rank {rank}", x=per_rank[rank][0], y=per_rank[rank][1],
            fill="toself", fillcolor=rank_color(rank), line=dict(color="white", width=1), hoverinfo="skip",
            legendgroup=f"rank {rank}", showlegend=True,
        ))
    traces.append(dict(
        type="scatter", mode="lines", name="replicated (data parallel)", x=rep_x, y=rep_y, fill="toself",
        fillcolor=REPLICATED_COLOR, line=dict(color="white", width=1), hoverinfo="skip",
        showlegend=bool(len(rep_x)),
    ))
    traces.append(dict(
        type="scatter", mode="markers", name="shards", x=hover_x, y=hover_y, hovertext=hover_text,
        customdata=hover_rank, hoverinfo="text", marker=dict(size=6, opacity=0), showlegend=False,
    ))
    sizes = placement.drop_duplicates("table")[["table", "num_embeddings", "embedding_dim"]]
    labels = [f"{name}<br>{int(rows):,} x {int(dim)}" for name, rows, dim in sizes.itertuples(index=False)]
    traces.append(dict(
        type="scatter", mode="text", name="tables", x=rects["label_x"].tolist(), y=rects["label_y"].tolist(),
        text=labels, textposition="bottom center", textfont=dict(size=9), hoverinfo="skip", showlegend=False,
    ))
    slot_columns = columns or max(1, math.ceil(math.sqrt(max(1, len(rects)) * 1.6)))
    slot_columns = min(slot_columns, max(1, len(rects)))
    slot_rows = max(1, math.ceil(len(rects) / slot_columns))
    width_units = slot_columns * (CELL + GAP)
    height_units = slot_rows * (CELL + GAP)
    # equal x and y scales (a table's shape means something); the height follows from ~720 px of plot width
    plot_height = 720 * height_units / width_units
    layout = dict(
        title=dict(text="Shard placement: each table is rows (down) x columns (across), colour = rank"),
        xaxis=dict(visible=False, range=[-0.1, width_units], scaleanchor="y", scaleratio=1, constrain="domain"),
        yaxis=dict(visible=False, range=[-height_units, 0.12], constrain="domain"),
        plot_bgcolor="white",
        height=int(min(1600, max(260, 90 + plot_height))),
        margin=dict(l=10, r=10, t=50, b=10),
        legend=dict(orientation="v", x=1.0, xanchor="left", y=1.0, yanchor="top", font=dict(size=11)),
        hovermode="closest",
    )
    return traces, layout


def shard_placement_figure(plan: PlanLike, tables: TablesLike = None, world_size: Optional[int] = None,
                           placement: Optional[pd.DataFrame] = None, backend: str = "plotly"):
    """Each table as a rows x columns rectangle cut into its shards, coloured by rank.

    Pass `placement` (a report's placement DataFrame with the columns of `placement_frame`) to skip
    recomputing it. backend="matplotlib" returns a static matplotlib Figure.
    """
    if placement is None:
        placement = placement_frame(plan, tables)
    if backend == "matplotlib":
        from rectoolkit.viz.static import shard_placement_mpl
        return shard_placement_mpl(placement, world_size)
    import plotly.graph_objects as go

    traces, layout = shard_placement_traces(placement, world_size)
    return go.Figure(data=traces, layout=layout)


def rank_table_traces(placement: pd.DataFrame, world_size: Optional[int] = None) -> Tuple[List[dict], dict]:
    """Plotly trace dicts and layout of the rank x table map (bytes of each table on each rank)."""
    grid = rank_table_bytes(placement, world_size)
    values = grid.to_numpy(dtype=np.float64)
    text = [[format_bytes(v) if v else "" for v in row] for row in values.tolist()]
    traces = [dict(
        type="heatmap", z=np.where(values > 0, values, np.nan), x=list(grid.columns),
        y=[f"rank {r}" for r in grid.index], text=text, colorscale="Blues", reversescale=True,
        hovertemplate="%{y} holds %{text} of %{x}<extra></extra>", zmin=0, zmax=max(1.0, float(values.max(initial=0))),
        colorbar=bytes_axis(max(1.0, float(values.max(initial=0)))), xgap=1, ygap=1,
    )]
    layout = dict(
        title=dict(text="Bytes of each table on each rank"),
        xaxis=dict(title=dict(text="table"), tickangle=-45, type="category"),
        yaxis=dict(title=dict(text=""), autorange="reversed", type="category"),
        height=max(260, 120 + 26 * len(grid.index)),
        margin=dict(l=70, r=10, t=50, b=90),
        plot_bgcolor="white",
    )
    return traces, layout


def rank_table_figure(plan: PlanLike, tables: TablesLike = None, world_size: Optional[int] = None,
                      placement: Optional[pd.DataFrame] = None, backend: str = "plotly"):
    """A rank x table map: cell (rank, table) shows the bytes of that table held by that rank."""
    if placement is None:
        placement = placement_frame(plan, tables)
    if backend == "matplotlib":
        from rectoolkit.viz.static import rank_table_mpl
        return rank_table_mpl(placement, world_size)
    import plotly.graph_objects as go

    traces, layout = rank_table_traces(placement, world_size)
    return go.Figure(data=traces, layout=layout)
