"""TorchRec's module path torchrec.distributed.types: the plan types (defined in rectoolkit.plan.types) and the
sharding environment (rectoolkit.distributed.comm). ParameterConstraints is here too, where some tutorials import
it from (TorchRec itself keeps it in torchrec.distributed.planner.types)."""

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.plan.types import (
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from rectoolkit.planner.constraints import ParameterConstraints

__all__ = ["EmbeddingModuleShardingPlan", "ParameterConstraints", "ParameterSharding", "ShardingEnv", "ShardingPlan",
           "ShardingType", "ShardMetadata"]
