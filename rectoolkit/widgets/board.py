"""PlacementBoard: every shard as a block in its rank's column; drag a block to another rank to move it.

An anywidget: the Python side holds the plan and computes what to draw (`columns`, `shards`, `message`);
the ES module in `widgets/placement_board.js` draws it and sends `move_request` on a drop. Moves go
through `rectoolkit.plan.edits.move_shard`, so the same edit is available without a browser:

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
    >>> t = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])
    >>> plan = ShardingPlan({"": {"t": ParameterSharding("table_wise", ranks=[0],
    ...                                                   shards=[ShardMetadata.on_rank(0, 0, 0, 10, 4)])}})
    >>> board = PlacementBoard(plan, [t], world_size=2)
    >>> board.move("t", 0, 1)
    True
    >>> [(s["id"], s["rank"]) for s in board.shards]
    [('t/0', 1)]
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import anywidget
import traitlets

from rectoolkit.plan.types import ShardingPlan
from rectoolkit.viz.frames import TablesLike, placement_frame, table_configs, weights_per_rank
from rectoolkit.viz.style import REPLICATED_COLOR, format_bytes, rank_color, text_color_on
from rectoolkit.widgets.assets import read_asset
from rectoolkit.plan.edits import MoveError, move_shard

# Colours follow the Placement view: a block has its rank's colour, replicas (DATA_PARALLEL) are grey.
HINT = ("Colour = rank, as in the Placement tab. Drag a shard to another rank (or click it, then a rank's "
        "header) to override the plan. Grey striped blocks are data-parallel replicas: one on every rank, "
        "they cannot move.")


class PlacementBoard(anywidget.AnyWidget):
    """Shards in rank columns. `board.plan` is the current plan; `on_move(callback)` hears every accepted move.

    Args:
        plan: the ShardingPlan to show.
        tables: table configs (sizes and data types for bytes).
        world_size: number of rank columns (default: highest rank used + 1).
        capacity_bytes: one number or one per rank, for the usage meter (optional).
        memory_bytes: bytes used per rank for the meter (default: the weights on each rank).
        local_world_size: ranks per host (two-level sharding types keep blocks inside a host).
    """

    _esm = traitlets.Unicode(read_asset("placement_board.js")).tag(sync=True)
    _css = traitlets.Unicode(read_asset("placement_board.css")).tag(sync=True)

    columns = traitlets.List(traitlets.Dict()).tag(sync=True)
    shards = traitlets.List(traitlets.Dict()).tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    message_kind = traitlets.Unicode("info").tag(sync=True)
    title = traitlets.Unicode("Placement board").tag(sync=True)
    hint = traitlets.Unicode(HINT).tag(sync=True)
    move_request = traitlets.Dict().tag(sync=True)

    def __init__(self, plan: ShardingPlan, tables: TablesLike = None, world_size: Optional[int] = None,
                 capacity_bytes=None, memory_bytes: Optional[Sequence[float]] = None,
                 local_world_size: Optional[int] = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self._tables = table_configs(tables)
        self._callbacks: List[Callable[[ShardingPlan, str, int, int], None]] = []
        self.local_world_size = local_world_size
        self.observe(self._on_move_request, names="move_request")
        self.set_plan(plan, world_size=world_size, capacity_bytes=capacity_bytes, memory_bytes=memory_bytes)

    # ------------------------------------------------------------------ Python API (what a drop does)

    def set_plan(self, plan: ShardingPlan, world_size: Optional[int] = None, capacity_bytes=None,
                 memory_bytes: Optional[Sequence[float]] = None, message: str = "",
                 local_world_size: Optional[int] = None, placement=None) -> None:
        """Show `plan` (and optionally new capacities/usage) without notifying move listeners.

        `placement`: the plan's `placement_frame`, when the caller already has it."""
        self.plan = plan
        self._placement = placement
        if local_world_size is not None:
            self.local_world_size = local_world_size
        used = plan.ranks_used()
        self.world_size = world_size or ((max(used) + 1) if used else 1)
        self._capacity = capacity_bytes
        self._memory = memory_bytes
        self._redraw()
        self._say(message, "info")

    def move(self, table: str, shard_index: int, rank: int) -> bool:
        """Move one shard; returns False (and shows why on the board) when the move is not allowed."""
        try:
            new_plan = move_shard(self.plan, table, shard_index, rank, world_size=self.world_size,
                                  local_world_size=self.local_world_size)
        except MoveError as error:
            self._say(str(error), "error")
            return False
        self.plan = new_plan
        self._placement = None
        self._memory = None  # usage is recomputed from the weights until the owner sets it
        self._redraw()
        self._say(f"moved {table} shard {shard_index} to rank {rank}", "info")
        for callback in self._callbacks:
            callback(new_plan, table, shard_index, rank)
        return True

    def on_move(self, callback: Callable[[ShardingPlan, str, int, int], None]) -> None:
        """Call `callback(new_plan, table, shard_index, rank)` after every accepted move."""
        self._callbacks.append(callback)

    def show_error(self, text: str) -> None:
        self._say(text, "error")

    # ------------------------------------------------------------------ drawing state

    def _on_move_request(self, change) -> None:
        request = change["new"] or {}
        if "id" not in request or "rank" not in request:
            return
        table, _, index = str(request["id"]).rpartition("/")
        if not table or not index.isdigit():
            self._say(f"unknown shard id {request['id']!r}", "error")
            return
        self.move(table, int(index), int(request["rank"]))

    def _say(self, text: str, kind: str) -> None:
        self.message_kind = kind
        self.message = text

    def _redraw(self) -> None:
        placement = self._placement if self._placement is not None else placement_frame(self.plan, self._tables or None)
        weights = weights_per_rank(placement, self.world_size)
        memory = list(self._memory) if self._memory is not None else [float(w) for w in weights]
        capacity = self._capacity
        capacities = ([float(capacity)] * self.world_size if isinstance(capacity, (int, float))
                      else [float(c) for c in capacity] if capacity is not None else [0.0] * self.world_size)
        columns = [
            {"rank": rank, "label": f"rank {rank}", "color": rank_color(rank), "bytes": float(memory[rank]),
             "capacity": capacities[rank], "over": bool(capacities[rank] and memory[rank] > capacities[rank])}
            for rank in range(self.world_size)
        ]
        biggest = max(1, int(placement["bytes"].max())) if len(placement) else 1
        shard_counts = placement["table"].value_counts().to_dict()
        shards = []
        for row in placement.itertuples(index=False):
            fixed = row.sharding_type == "data_parallel"
            color = REPLICATED_COLOR if fixed else rank_color(int(row.rank))
            shards.append({
                "id": f"{row.table}/{row.shard}",
                "table": row.table,
                "shard": int(row.shard),
                "rank": int(row.rank),
                "type": row.sharding_type,
                "bytes": int(row.bytes),
                "movable": not fixed,
                "color": color,
                "text_color": text_color_on(color),  # the palette has light colours: dark text on those
                "height": int(14 + 36 * math.sqrt(row.bytes / biggest)),
                "label": (f"{row.table} (replica)" if fixed else
                          row.table if shard_counts[row.table] == 1 else f"{row.table} #{row.shard}"),
                "tooltip": (f"{row.table} shard {row.shard} ({row.sharding_type}): rows {row.row_start}:{row.row_end}, "
                            f"cols {row.col_start}:{row.col_end}, {format_bytes(row.bytes)}"
                            + (" - a data-parallel replica (one on every rank): it cannot move" if fixed else "")),
            })
        with self.hold_sync():  # one message: a page never draws the new columns with the old shards
            self.columns = columns
            self.shards = shards
