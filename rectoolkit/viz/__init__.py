"""Figures of plans, reports and training runs (plotly by default, matplotlib with backend="matplotlib").

No widget code lives here: every function takes plain objects (a ShardingPlan, table configs, DataFrames,
dicts of [W, W] byte matrices) and returns a figure or a DataFrame.
"""

from rectoolkit.viz.comm import comm_matrix_figure, comm_summary
from rectoolkit.viz.diff import plan_diff_figure
from rectoolkit.viz.frames import PlanDiff, placement_frame, plan_diff, rank_table_bytes, table_shardings
from rectoolkit.viz.memory import memory_figure
from rectoolkit.viz.placement import rank_table_figure, shard_placement_figure
from rectoolkit.viz.quant import memory_error_figure
from rectoolkit.viz.style import format_bytes, humanized, rank_color
from rectoolkit.viz.timing import rank_time_figure
from rectoolkit.viz.training import comparison_frame, measured_vs_estimated_figure, training_curves_figure
from rectoolkit.viz.two_dimensional import two_dimensional_figure

__all__ = [
    "PlanDiff", "comm_matrix_figure", "comm_summary", "comparison_frame", "format_bytes",
    "humanized", "measured_vs_estimated_figure", "memory_error_figure", "memory_figure", "placement_frame", "plan_diff", "plan_diff_figure",
    "rank_color", "rank_table_bytes", "rank_table_figure", "rank_time_figure", "shard_placement_figure",
    "table_shardings", "training_curves_figure", "two_dimensional_figure",
]
