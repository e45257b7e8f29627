"""Static matplotlib versions of the figures (for papers, PDFs and plain HTML exports).

They draw the same data as the plotly builders and return a `matplotlib.figure.Figure` made without
pyplot, so no global figure state is touched. Call them through the builders with backend="matplotlib".

    >>> import pandas as pd
    >>> fig = memory_mpl(pd.DataFrame({"rank": [0], "weights_bytes": [5], "capacity_bytes": [4]}))
    >>> len(fig.axes[0].patches)  # the weights bar and the red overflow bar
    2
"""

from __future__ import annotations

import io
from typing import Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from rectoolkit.viz.comm import TOTAL, comm_options
from rectoolkit.viz.frames import rank_table_bytes
from rectoolkit.viz.memory import memory_stacks
from rectoolkit.viz.placement import CELL, GAP, table_rectangles
from rectoolkit.viz.style import (
    CAPACITY_COLOR, OVERFLOW_COLOR, REPLICATED_COLOR, component_color, format_bytes, format_ms, pretty_component,
    rank_color,
)
from rectoolkit.viz.timing import time_components


class StaticFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in notebooks (and in their HTML exports) without pyplot."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
        return buffer.getvalue()


def shard_placement_mpl(placement: pd.DataFrame, world_size: Optional[int] = None) -> Figure:
    """Each table's rectangle cut into shards, one Rectangle patch per shard, coloured by rank."""
    if world_size is None:
        world_size = int(placement["rank"].max()) + 1 if len(placement) else 1
    rects = table_rectangles(placement)
    boxes = {r.table: r for r in rects.itertuples(index=False)}
    slot_rows = max(1, int(round(-rects["y0"].min() / (CELL + GAP))) + 1) if len(rects) else 1
    fig = StaticFigure(figsize=(10, 1.6 + 1.5 * slot_rows))
    ax = fig.add_subplot(1, 1, 1)
    for row in placement.itertuples(index=False):
        if row.sharding_type == "data_parallel" and row.rank != 0:
            continue
        box = boxes[row.table]
        left = box.x0 + box.width * row.col_start / max(1, row.embedding_dim)
        width = box.width * (row.col_end - row.col_start) / max(1, row.embedding_dim)
        top = box.y0 - box.height * row.row_start / max(1, row.num_embeddings)
        height = box.height * (row.row_end - row.row_start) / max(1, row.num_embeddings)
        color = REPLICATED_COLOR if row.sharding_type == "data_parallel" else rank_color(row.rank)
        ax.add_patch(Rectangle((left, top - height), width, height, facecolor=color, edgecolor="white", linewidth=0.8))
    for box in rects.itertuples(index=False):
        ax.text(box.label_x, box.label_y, box.table, ha="center", va="top", fontsize=7)
    handles = [Rectangle((0, 0), 1, 1, color=rank_color(r)) for r in range(world_size)]
    names = [f"rank {r}" for r in range(world_size)]
    if (placement["sharding_type"] == "data_parallel").any():
        handles.append(Rectangle((0, 0), 1, 1, color=REPLICATED_COLOR))
        names.append("replicated")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_aspect("equal")
    ax.autoscale_view()
    ax.set_xlim(rects["x0"].min() - 0.1, (rects["x0"] + rects["width"]).max() + 0.1) if len(rects) else None
    ax.set_ylim(rects["label_y"].min() - 0.3, 0.1) if len(rects) else None
    ax.axis("off")
    ax.set_title("Shard placement (colour = rank)")
    fig.tight_layout()
    return fig


def rank_table_mpl(placement: pd.DataFrame, world_size: Optional[int] = None) -> Figure:
    grid = rank_table_bytes(placement, world_size)
    fig = StaticFigure(figsize=(max(5, 0.35 * len(grid.columns) + 2), max(2.5, 0.35 * len(grid.index) + 1.5)))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(np.ma.masked_equal(grid.to_numpy(dtype=float), 0), cmap="Blues", aspect="auto")
    ax.set_xticks(range(len(grid.columns)), list(grid.columns), rotation=90, fontsize=7)
    ax.set_yticks(range(len(grid.index)), [f"rank {r}" for r in grid.index], fontsize=8)
    fig.colorbar(image, ax=ax, label="bytes")
    ax.set_title("Bytes of each table on each rank")
    fig.tight_layout()
    return fig


def memory_mpl(memory: pd.DataFrame, components: Optional[Sequence[str]] = None,
               capacity: Optional[str] = None) -> Figure:
    ranks, names, values, cap, overflow = memory_stacks(memory, components, capacity)
    fig = StaticFigure(figsize=(max(4, 0.6 * len(ranks) + 2), 3.5))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(ranks))
    base = np.zeros(len(ranks))
    for index, (name, row) in enumerate(zip(names, values)):
        ax.bar(x, row, bottom=base, color=component_color(name, index), label=pretty_component(name))
        base = base + row
    over = overflow > 0
    if over.any():
        ax.bar(x[over], overflow[over], bottom=cap[over], color=OVERFLOW_COLOR, alpha=0.85, label="over capacity")
    if np.isfinite(cap).any():
        ax.hlines(cap, x - 0.45, x + 0.45, colors=CAPACITY_COLOR, linewidth=2, label="capacity")
    ax.set_xticks(x, [f"rank {r}" for r in ranks])
    ax.set_ylabel("bytes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title("Memory per rank")
    fig.tight_layout()
    return fig


def comm_matrix_mpl(matrices: Mapping[str, np.ndarray], collective: str = TOTAL) -> Figure:
    options = comm_options(matrices, keep_empty=True)
    if collective not in options:
        raise KeyError(f"no collective {collective!r}; choose one of {list(options)}")
    matrix = options[collective]
    world_size = matrix.shape[0]
    fig = StaticFigure(figsize=(max(3.5, 0.5 * world_size + 2), max(3, 0.5 * world_size + 1.5)))
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(matrix, cmap="viridis", vmin=0)
    if world_size <= 16:
        top = matrix.max() or 1.0
        for src in range(world_size):
            for dst in range(world_size):
                if matrix[src, dst]:
                    ax.text(dst, src, format_bytes(matrix[src, dst]), ha="center", va="center", fontsize=6,
                            color="black" if matrix[src, dst] > 0.6 * top else "white")
    ax.set_xticks(range(world_size))
    ax.set_yticks(range(world_size))
    ax.set_xlabel("destination rank")
    ax.set_ylabel("source rank")
    fig.colorbar(image, ax=ax, label="bytes")
    ax.set_title(f"Bytes per step, {collective}")
    fig.tight_layout()
    return fig


def rank_time_mpl(times: pd.DataFrame, components: Optional[Sequence[str]] = None) -> Figure:
    names = time_components(times, components)
    ranks = times["rank"].to_numpy() if "rank" in times.columns else times.index.to_numpy()
    fig = StaticFigure(figsize=(max(4, 0.6 * len(ranks) + 2), 3.2))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(ranks))
    base = np.zeros(len(ranks))
    for index, name in enumerate(names):
        row = times[name].to_numpy(dtype=float)
        ax.bar(x, row, bottom=base, color=component_color(name, index), label=pretty_component(name))
        base = base + row
    if len(base):
        slowest = int(np.argmax(base))
        ax.bar([x[slowest]], [base[slowest]], fill=False, edgecolor=OVERFLOW_COLOR, linewidth=2)
        ax.set_title(f"Estimated step time per rank (slowest: rank {ranks[slowest]}, {format_ms(base[slowest])})")
    ax.set_xticks(x, [f"rank {r}" for r in ranks])
    ax.set_ylabel("ms per step")
    ax.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig
