"""TorchRec's module path torchrec.distributed.types (a path module: re-exports only; see rectoolkit.compat).

The plan types (defined in rectoolkit.plan.types), the sharding environment (rectoolkit.distributed.comm; the 2D one
and DMPCollectionConfig: rectoolkit.distributed.two_dimensional), TorchRec's
interfaces and enums (ShardedModule, ParameterStorage, ...: rectoolkit.distributed.interfaces; ShardingPlanner:
rectoolkit.planner.interface) and
LazyAwaitable (rectoolkit.distributed.awaitable), CommOp and QuantizedCommCodecs
(rectoolkit.distributed.fbgemm_qcomm_codec). ParameterConstraints is here too, where some tutorials import it from
(TorchRec itself keeps it in torchrec.distributed.planner.types).
"""

from rectoolkit.distributed.awaitable import Awaitable, LazyAwaitable, LazyNoWait, NoWait
from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.fbgemm_qcomm_codec import (
    CommOp,
    NoOpQuantizedCommCodec,
    QuantizedCommCodec,
    QuantizedCommCodecs,
)
from rectoolkit.distributed.interfaces import (
    CacheStatistics,
    ComputeDevice,
    ComputeKernel,
    NullShardedModuleContext,
    NullShardingContext,
    ParameterStorage,
    PipelineType,
    ShardedModule,
    ShardingStrategy,
    StorageUsageType,
    compute_storage_usage,
    get_tensor_size_bytes,
    rank_device,
)
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.distributed.two_dimensional import DMPCollectionConfig, ShardingEnv2D
from rectoolkit.distributed.utils import ShardingBucketMetadata
from rectoolkit.modules.configs import DataType
from rectoolkit.plan.types import (
    BoundsCheckMode,
    CacheAlgorithm,
    CacheParams,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from rectoolkit.planner.constraints import ParameterConstraints
from rectoolkit.planner.interface import ShardingPlanner

__all__ = [
    "Awaitable", "BoundsCheckMode", "CacheAlgorithm", "CacheParams", "CacheStatistics", "CommOp",
    "compute_storage_usage", "ComputeDevice", "ComputeKernel", "DataType", "DMPCollectionConfig", "EmbeddingModuleShardingPlan",
    "EnumerableShardingSpec", "get_tensor_size_bytes", "LazyAwaitable", "LazyNoWait", "ModuleSharder",
    "ModuleShardingPlan", "NoOpQuantizedCommCodec", "NoWait", "NullShardedModuleContext", "NullShardingContext",
    "ParameterConstraints", "ParameterSharding", "ParameterStorage", "PipelineType", "QuantizedCommCodec",
    "QuantizedCommCodecs", "rank_device", "ShardedModule", "ShardingBucketMetadata", "ShardingEnv", "ShardingEnv2D", "ShardingPlan",
    "ShardingPlanner", "ShardingStrategy", "ShardingType", "ShardMetadata", "StorageUsageType"]
