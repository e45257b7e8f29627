"""Notebook widgets: explore sharding plans, drag shards between ranks, watch training, learn the jagged types.

Thin layers over the core (planner, plan, launch) and `rectoolkit.viz`; every widget keeps its state in Python
objects and traitlets, so tests drive them without a browser.
"""

from rectoolkit.widgets.board import PlacementBoard
from rectoolkit.plan.edits import MoveError, move_shard
from rectoolkit.widgets.explorer import PlanExplorer
from rectoolkit.widgets.inputs import TableSet, as_table_set
from rectoolkit.widgets.kjt import BatchTrace, KJTView
from rectoolkit.widgets.live_figure import LiveFigure
from rectoolkit.widgets.plotly_view import PlotlyView
from rectoolkit.widgets.monitor import TrainingMonitor, for_training
from rectoolkit.widgets.planning import ExplorerSettings, PlanningResult, plan_and_report

__all__ = [
    "BatchTrace", "ExplorerSettings", "KJTView", "LiveFigure", "MoveError", "PlacementBoard", "PlanExplorer",
    "PlanningResult", "PlotlyView", "TableSet", "TrainingMonitor", "as_table_set", "for_training", "move_shard",
    "plan_and_report",
]
