"""TorchRec's module path torchrec.distributed.types (a path module: re-exports only; see rectoolkit.compat).

The plan types (defined in rectoolkit.plan.types), the sharding environment (rectoolkit.distributed.comm) and
LazyAwaitable (rectoolkit.distributed.awaitable), CommOp and QuantizedCommCodecs
(rectoolkit.distributed.fbgemm_qcomm_codec). ParameterConstraints is here too, where some tutorials import it from
(TorchRec itself keeps it in torchrec.distributed.planner.types).
"""

from rectoolkit.distributed.awaitable import Awaitable, LazyAwaitable, LazyNoWait, NoWait
from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.fbgemm_qcomm_codec import CommOp, QuantizedCommCodecs
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.modules.configs import DataType
from rectoolkit.plan.types import (
    BoundsCheckMode,
    CacheAlgorithm,
    CacheParams,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from rectoolkit.planner.constraints import ParameterConstraints

__all__ = ["Awaitable", "BoundsCheckMode", "CacheAlgorithm", "CacheParams", "CommOp", "DataType", "EmbeddingModuleShardingPlan", "EnumerableShardingSpec", "LazyAwaitable", "LazyNoWait", "ModuleSharder", "NoWait", "ParameterConstraints", "ParameterSharding", "QuantizedCommCodecs", "ShardingEnv", "ShardingPlan",
           "ShardingType", "ShardMetadata"]
