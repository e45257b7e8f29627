"""TorchRec's module path torchrec.distributed.embedding_types (a path module: re-exports only; see rectoolkit.compat).

TorchRec code reads the compute kernels from here (`ParameterConstraints(compute_kernels=[
EmbeddingComputeKernel.FUSED.value])`), and the sharding types, pooling and data types with them. The kernels are
TorchRec's that rectoolkit runs (dense, fused, fused_uvm, fused_uvm_caching and the quantized ones); TorchRec's
key-value and virtual-table kernels are not members here.
"""

from rectoolkit.distributed.all_to_one import KJTList
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.modules.configs import DataType, PoolingType
from rectoolkit.plan.types import EmbeddingComputeKernel, ShardingType, ShardMetadata

__all__ = ["DataType", "EmbeddingComputeKernel", "KJTList", "ModuleSharder", "PoolingType", "ShardMetadata",
           "ShardingType"]
