"""Shared look of every rectoolkit figure: one colour per rank, one per memory/time component, byte labels.

    >>> rank_color(0) == rank_color(0), rank_color(0) != rank_color(1)
    (True, True)
    >>> format_bytes(3 * 2**30)
    '3.00 GiB'
    >>> binary_ticks(16 * 2**30)[1]
    ['0 B', '4 GiB', '8 GiB', '12 GiB', '16 GiB']
"""

from __future__ import annotations

import colorsys
import re
from typing import Any, List, Optional, Tuple

import pandas as pd

# Plotly's qualitative "Plotly" palette followed by "D3"-like extras: distinct for the first 20 ranks.
_RANK_PALETTE = [
    "#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880",
    "#FF97FF", "#FECB52", "#1F77B4", "#2CA02C", "#8C564B", "#E377C2", "#7F7F7F", "#BCBD22",
    "#17BECF", "#9467BD", "#D62728", "#FF7F0E",
]

OVERFLOW_COLOR = "#E11D48"  # memory above capacity, plans that do not fit
REPLICATED_COLOR = "#9CA3AF"  # DATA_PARALLEL tables: a replica on every rank
CAPACITY_COLOR = "#111827"

# Memory and time components in stacking order, with fixed colours so every figure agrees.
COMPONENT_COLORS = {
    "weights": "#3B82F6",
    "optimizer": "#F59E0B",
    "buffers": "#10B981",
    "dense": "#8B5CF6",
    "lookup_fwd": "#2563EB",
    "lookup_bwd": "#93C5FD",
    "lookup": "#3B82F6",
    "gradients": "#EC4899",
    "input_buffer": "#10B981",
    "output_buffer": "#6EE7B7",
    "input_dist": "#F97316",
    "output_dist_intra": "#FDBA74",
    "output_dist_inter": "#B45309",
    "output_dist_backward": "#EF4444",
    "output_dist_intra_backward": "#FCA5A5",
    "output_dist_inter_backward": "#991B1B",
    "output_dist": "#FB923C",
    "dp_allreduce": "#A855F7",
    "comm": "#F97316",
    "communication": "#F97316",
    "compute": "#3B82F6",
    "estimated": "#94A3B8",
    "measured": "#0EA5E9",
}


def rank_color(rank: int) -> str:
    """The colour of `rank` in every figure (distinct for 20 ranks, then evenly spaced hues)."""
    if rank < len(_RANK_PALETTE):
        return _RANK_PALETTE[rank]
    hue = (rank * 0.618033988749895) % 1.0  # golden-ratio hue steps stay distinct for a long while
    red, green, blue = colorsys.hls_to_rgb(hue, 0.5, 0.65)
    return "#{:02X}{:02X}{:02X}".format(int(red * 255), int(green * 255), int(blue * 255))


DARK_TEXT, LIGHT_TEXT = "#111827", "#FFFFFF"


def _luminance(color: str) -> float:
    """WCAG relative luminance of "#RRGGBB"."""
    def linear(channel: int) -> float:
        value = channel / 255
        return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4

    red, green, blue = (int(color.lstrip("#")[i:i + 2], 16) for i in (0, 2, 4))
    return 0.2126 * linear(red) + 0.7152 * linear(green) + 0.0722 * linear(blue)


def text_color_on(background: str) -> str:
    """Dark or white text, whichever has more (WCAG) contrast on `background` ("#RRGGBB").

        >>> text_color_on("#B6E880"), text_color_on("#1F77B4")
        ('#111827', '#FFFFFF')
    """
    def contrast(a: str, b: str) -> float:
        high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
        return (high + 0.05) / (low + 0.05)

    return max((DARK_TEXT, LIGHT_TEXT), key=lambda text: contrast(text, background))


def rank_colors(world_size: int) -> List[str]:
    return [rank_color(rank) for rank in range(world_size)]


def component_color(name: str, index: int = 0) -> str:
    """Colour of a memory/time component by its name ("weights_bytes" -> the weights colour)."""
    key = name.lower()
    matches = [prefix for prefix in COMPONENT_COLORS if key.startswith(prefix)]
    if matches:
        return COMPONENT_COLORS[max(matches, key=len)]  # the most specific name wins
    return _RANK_PALETTE[(index + 10) % len(_RANK_PALETTE)]


def format_bytes(num_bytes: float) -> str:
    """Bytes with a binary unit: 1536 -> '1.50 KiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def _short_bytes(value: float, unit: str, scale: float) -> str:
    number = value / scale
    return f"{number:.0f} {unit}" if number == round(number) else f"{number:.3g} {unit}"


def binary_ticks(max_bytes: float, count: int = 5) -> Tuple[List[float], List[str]]:
    """Tick positions and labels for a bytes axis from 0 to `max_bytes`, in binary units (GiB, MiB, ...).

    Steps are powers of two of the unit, so ticks read '4 GiB', '8 GiB', '16 GiB' (never '17.2G').
    """
    top = float(max_bytes) if max_bytes and max_bytes > 0 else 1.0
    unit, scale = "B", 1.0
    for name, size in (("KiB", 2 ** 10), ("MiB", 2 ** 20), ("GiB", 2 ** 30), ("TiB", 2 ** 40)):
        if top >= size:
            unit, scale = name, float(size)
    raw = top / scale / max(1, count - 1)
    step = next(2.0 ** k for k in range(-3, 11) if 2.0 ** k >= raw)  # powers of two: 16 GiB is a tick
    if unit == "B":
        step = max(step, 1)
    values = [i * step * scale for i in range(int(top / (step * scale) + 1e-9) + 2)]
    values = [v for v in values if v <= top * 1.0000001] or [0.0]
    if values[-1] < top * 0.999:  # one tick past the top, so the highest bar is below a labelled line
        values.append(values[-1] + step * scale)
    return values, ["0 B" if v == 0 else _short_bytes(v, unit, scale) for v in values]


def bytes_axis(max_bytes: float, title: str = "bytes", **extra: Any) -> dict:
    """A plotly axis (or colour bar) dict with binary-unit ticks from 0 to `max_bytes`."""
    values, labels = binary_ticks(max_bytes)
    return dict(title=dict(text=title), tickmode="array", tickvals=values, ticktext=labels, **extra)


def signed_bytes_axis(largest_change: float, title: str) -> dict:
    """A bytes axis symmetric around 0 (gains above, losses below), in binary units: '-8 MiB', '8 MiB'."""
    values, labels = binary_ticks(abs(largest_change) or 1.0)
    return dict(title=dict(text=title), tickmode="array", tickvals=[-v for v in values[:0:-1]] + values,
                ticktext=[f"-{label}" for label in labels[:0:-1]] + labels,
                range=[-values[-1] * 1.05, values[-1] * 1.05])


def unit_of(name: str) -> str:
    """The unit a column (or row) name announces: 'bytes', 'ms', or '' for a plain number.

        >>> unit_of("weights_bytes"), unit_of("bytes sent, estimated"), unit_of("slowest rank (ms)"), unit_of("rows")
        ('bytes', 'bytes', 'ms', '')
    """
    name = name.lower()
    # "weights_bytes", "bytes sent, estimated", "bytes_across_links": bytes wherever the word stands
    if re.search(r"(^|[^a-z])bytes([^a-z]|$)", name) or name in ("memory", "size"):
        return "bytes"
    if name.endswith(("_ms", "(ms)")) or name == "ms":
        return "ms"
    return ""


def humanize(value: Any, column: str = "", unit: Optional[str] = None) -> str:
    """One table cell for people: bytes in binary units (by column name, or `unit="bytes"`), ms with few
    digits, big ints with separators, floats with 4 significant digits.

        >>> humanize(206209024.0, "weights_bytes"), humanize(0.012345678, "total_ms"), humanize(1234567)
        ('196.66 MiB', '0.012 ms', '1,234,567')
        >>> humanize(2048, "measured", unit="bytes"), humanize(6141.228881, "samples_per_s")
        ('2.00 KiB', '6,141')
    """
    if value is None or (isinstance(value, float) and value != value):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "dtype"):
        return str(value)
    number = float(value)
    kind = unit_of(column) if unit is None else unit
    if kind == "bytes":
        return format_bytes(number)
    if kind == "ms":
        return format_ms(number)
    if kind:
        raise ValueError(f"humanize: unknown unit {kind!r} for column {column!r}; use 'bytes', 'ms' or ''")
    if abs(number) < 1e15 and (number == int(number) or abs(number) >= 1000):
        return f"{round(number):,}"  # 1881.4 samples/s -> '1,881', not '1881' or '1.881e+03'
    return f"{number:.4g}"


def humanized(frame: Any, unit: Optional[str] = None) -> Any:
    """A copy of a DataFrame for reading: every cell through `humanize`. A cell's unit comes from its column's
    name, else from its row's name (a transposed summary: rows 'total_bytes', 'max_time_ms'), else `unit`
    ('bytes' or 'ms') when the whole frame holds one kind of number. Keep the numeric frame for computing.

        >>> import pandas as pd
        >>> humanized(pd.DataFrame({"bytes": [206209024.0], "ms": [15.823211669921875]})).to_dict("records")
        [{'bytes': '196.66 MiB', 'ms': '15.82 ms'}]
        >>> humanized(pd.DataFrame({"plan A": [206209024.0, 0.4413], "plan B": [2.5e8, 0.33297]},
        ...                        index=["total_bytes", "max_time_ms"]))["plan A"].tolist()
        ['196.66 MiB', '0.441 ms']
        >>> humanized(pd.DataFrame({"estimated": [1824000], "measured": [1824000]}), unit="bytes").iloc[0].tolist()
        ['1.74 MiB', '1.74 MiB']
    """
    def readable(column: Any) -> Any:
        column_unit = unit_of(str(column.name))
        cells = [humanize(value, unit=column_unit or unit_of(str(row)) or unit or "")
                 for row, value in column.items()]
        return pd.Series(cells, index=column.index, name=column.name, dtype=object)

    return frame.apply(readable)


def format_ms(ms: float) -> str:
    """Milliseconds with 3 significant-ish digits: 0.125 ms, 2.25 ms, 123.4 ms."""
    if abs(ms) < 1:
        return f"{ms:.3f} ms"
    return f"{ms:.2f} ms" if abs(ms) < 100 else f"{ms:.1f} ms"


def pretty_component(name: str) -> str:
    """'optimizer_bytes' -> 'optimizer', 'lookup_fwd_ms' -> 'lookup fwd'."""
    for suffix in ("_bytes", "_ms", "_s"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name.replace("_", " ")
