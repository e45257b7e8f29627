"""TorchRec's sharders: what sharding types and compute kernels a collection supports.

TorchRec's planner and DistributedModelParallel take a list of sharders, one per module type they may shard.
rectoolkit shards every EmbeddingBagCollection and EmbeddingCollection it finds, so passing these is optional;
they exist so that TorchRec code runs unchanged, and they answer the same questions TorchRec's do.

    >>> EmbeddingCollectionSharder().sharding_types("cuda")
    ['table_wise', 'column_wise', 'row_wise', 'data_parallel']
"""

from __future__ import annotations

from typing import List, Type

from torch import nn

from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.plan.types import CPU_KERNELS, CUDA_KERNELS, EmbeddingComputeKernel, ShardingType

# the planner's kernels per device, plus "dense" (plain weights), which a plan may also ask for
_TRAINING_KERNELS = {
    "cuda": [EmbeddingComputeKernel.DENSE, *CUDA_KERNELS],
    "cpu": [EmbeddingComputeKernel.DENSE, *CPU_KERNELS],
}


class EmbeddingBagCollectionSharder:
    """Shards EmbeddingBagCollection: all six sharding types."""

    module_type: Type[nn.Module] = EmbeddingBagCollection
    _types = [ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_ROW_WISE,
              ShardingType.GRID_SHARD, ShardingType.DATA_PARALLEL]

    def sharding_types(self, compute_device_type: str) -> List[str]:
        _check_device(compute_device_type)
        return [t.value for t in self._types]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        _check_device(compute_device_type)
        if ShardingType(sharding_type) not in self._types:
            raise ValueError(f"{type(self).__name__}: sharding type {sharding_type!r} is not supported; "
                             f"choose from {self.sharding_types(compute_device_type)}")
        if ShardingType(sharding_type) == ShardingType.DATA_PARALLEL:
            return [EmbeddingComputeKernel.DENSE.value]
        return [k.value for k in _TRAINING_KERNELS[compute_device_type]]


class EmbeddingCollectionSharder(EmbeddingBagCollectionSharder):
    """Shards EmbeddingCollection (sequence embeddings): table-, column-, row-wise and data parallel."""

    module_type = EmbeddingCollection
    _types = [ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL]


def _check_device(compute_device_type: str) -> None:
    if compute_device_type not in _TRAINING_KERNELS:
        raise ValueError(f"compute_device_type {compute_device_type!r}: use 'cuda' or 'cpu'")
