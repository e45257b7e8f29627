"""TorchRec's module path torchrec.distributed.planner.planners (a path module, see rectoolkit.compat)."""

from rectoolkit.planner import EmbeddingShardingPlanner

__all__ = ["EmbeddingShardingPlanner"]
