"""TorchRec's module path torchrec.distributed.embedding_types (a path module: re-exports only; see rectoolkit.compat).

TorchRec code reads the compute kernels from here (`ParameterConstraints(compute_kernels=[
EmbeddingComputeKernel.FUSED.value])`), and the sharding types, pooling and data types with them. The kernels are
TorchRec's that rectoolkit runs (dense, fused, fused_uvm, fused_uvm_caching and the quantized ones); TorchRec's
key-value and virtual-table kernels are not members here. TorchRec's table and group dataclasses
(ShardedEmbeddingTable, GroupedEmbeddingConfig, ...) live in rectoolkit.distributed.sharded_tables, KJTList, ListOfKJTList
and InputDistOutputs in rectoolkit.distributed.kjt_lists, OptimType in rectoolkit.optim.optim_type.
"""

from rectoolkit.distributed.kjt_lists import InputDistOutputs, KJTList, ListOfKJTList
from rectoolkit.distributed.sharded_tables import (
    DTensorMetadata,
    EmbeddingAttributes,
    GroupedEmbeddingConfig,
    ShardedConfig,
    ShardedEmbeddingTable,
    ShardedMetaConfig,
)
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.modules.configs import DataType, PoolingType
from rectoolkit.optim.optim_type import OptimType
from rectoolkit.plan.types import EmbeddingComputeKernel, ShardingType, ShardMetadata

__all__ = ["DTensorMetadata", "DataType", "EmbeddingAttributes", "EmbeddingComputeKernel", "GroupedEmbeddingConfig",
           "InputDistOutputs", "KJTList", "ListOfKJTList", "ModuleSharder", "OptimType", "PoolingType",
           "ShardMetadata", "ShardedConfig", "ShardedEmbeddingTable", "ShardedMetaConfig", "ShardingType"]
