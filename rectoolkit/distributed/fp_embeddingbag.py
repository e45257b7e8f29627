"""TorchRec's torchrec.distributed.fp_embeddingbag: the sharder of FeatureProcessedEmbeddingBagCollection.

TorchRec shards a feature-processed collection as a whole: its plan is keyed by the collection's own path ("fp"),
the feature processors (position weights) stay dense on every rank and the EmbeddingBagCollection inside is
sharded by that plan. rectoolkit does the same: the planner plans such tables at the wrapper's path when this
sharder is among `sharders` (or sharders is None), DistributedModelParallel shards the inner collection by it,
and `shard()` returns the feature-processed collection with its inner collection sharded.

    >>> FeatureProcessedEmbeddingBagCollectionSharder().sharding_types("cpu")
    ['data_parallel', 'table_wise', 'column_wise', 'table_column_wise', 'table_row_wise', 'row_wise', 'grid_shard']
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Mapping, Optional, Type

import torch
from torch import nn

from rectoolkit.distributed.fbgemm_qcomm_codec import QuantizedCommCodecs
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, ModuleSharder
from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from rectoolkit.plan.types import ShardingType

# TorchRec 1.8's order (FeatureProcessedEmbeddingBagCollectionSharder.sharding_types)
_TYPES = [ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
          ShardingType.TABLE_COLUMN_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.ROW_WISE, ShardingType.GRID_SHARD]


class FeatureProcessedEmbeddingBagCollectionSharder(ModuleSharder):
    """Shards FeatureProcessedEmbeddingBagCollection through its inner collection's sharder.

    Args:
        ebc_sharder: the EmbeddingBagCollectionSharder for the inner collection (its `fused_params` set the shards'
            fused optimizer); default: EmbeddingBagCollectionSharder().
        qcomm_codecs_registry: the output exchanges' wire precisions (get_qcomm_codecs_registry's), for the default
            inner sharder; with an `ebc_sharder`, give the registry to that sharder instead.
    """

    def __init__(self, ebc_sharder: Optional[EmbeddingBagCollectionSharder] = None,
                 qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None) -> None:
        super().__init__(qcomm_codecs_registry)
        if ebc_sharder is not None and not isinstance(ebc_sharder, EmbeddingBagCollectionSharder):
            raise TypeError(f"FeatureProcessedEmbeddingBagCollectionSharder(ebc_sharder=...): got a "
                            f"{type(ebc_sharder).__name__}; pass an EmbeddingBagCollectionSharder (or None)")
        if ebc_sharder is not None and qcomm_codecs_registry is not None \
                and ebc_sharder.qcomm_codecs_registry != self._qcomm_codecs_registry:
            raise ValueError("FeatureProcessedEmbeddingBagCollectionSharder: the ebc_sharder shards the tables, so "
                             "its qcomm_codecs_registry is the one used; pass the registry to "
                             "EmbeddingBagCollectionSharder(qcomm_codecs_registry=...) only")
        self._ebc_sharder = ebc_sharder if ebc_sharder is not None else EmbeddingBagCollectionSharder(
            qcomm_codecs_registry=self._qcomm_codecs_registry)

    @property
    def module_type(self) -> Type[nn.Module]:
        return FeatureProcessedEmbeddingBagCollection

    @property
    def fused_params(self) -> Optional[Dict[str, Any]]:
        return self._ebc_sharder.fused_params

    @property
    def qcomm_codecs_registry(self) -> Optional[Dict[str, QuantizedCommCodecs]]:
        """The inner sharder's registry: the one the tables' output exchanges use."""
        return self._ebc_sharder.qcomm_codecs_registry

    def shard(self, module: nn.Module, params: Mapping[str, Any], env: Any, device: Optional[torch.device] = None,
              module_fqn: Optional[str] = None) -> nn.Module:
        """A copy of `module` (its feature processors shared) whose inner collection is sharded by `params` (table
        name -> ParameterSharding); `module` itself is left as it was."""
        if not isinstance(module, FeatureProcessedEmbeddingBagCollection):
            raise TypeError(f"FeatureProcessedEmbeddingBagCollectionSharder.shard: got a {type(module).__name__}, "
                            "this sharder shards FeatureProcessedEmbeddingBagCollection")
        inner_fqn = f"{module_fqn}._embedding_bag_collection" if module_fqn else "_embedding_bag_collection"
        sharded_inner = self._ebc_sharder.shard(module._embedding_bag_collection, params, env, device, inner_fqn)
        sharded = copy.copy(module)
        sharded._modules = dict(module._modules)  # (a shallow copy shares the dict: keep `module`'s own untouched)
        sharded._embedding_bag_collection = sharded_inner
        sharded.module_fqn = module_fqn
        return sharded

    def shardable_parameters(self, module: nn.Module) -> Dict[str, nn.Parameter]:
        """Table name -> its weight, from the inner collection."""
        return self._ebc_sharder.shardable_parameters(module._embedding_bag_collection)

    def sharding_types(self, compute_device_type: str) -> List[str]:
        self._ebc_sharder.sharding_types(compute_device_type)  # (refuses an unknown device, naming the choices)
        return [t.value for t in _TYPES]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        return self._ebc_sharder.compute_kernels(sharding_type, compute_device_type)
