"""TorchRec's module path torchrec.distributed.planner (a path module, see rectoolkit.compat); the planner
itself is rectoolkit.planner."""

from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology

__all__ = ["EmbeddingShardingPlanner", "ParameterConstraints", "PlannerError", "Topology"]

from rectoolkit.distributed.planner import constants, planners, stats, storage_reservations, types, utils  # noqa: E402,F401  (attribute paths: torchrec.distributed.planner.types)
