"""A ManagedCollisionEmbeddingBagCollection sharded row-wise (TorchRec's `torchrec.distributed.mc_embeddingbag`;
the sequence twin is in mc_embedding.py).

    KJT (this rank's samples) --ShardedManagedCollisionCollection--> global rows
        --ShardedEmbeddingBagCollection (ROW_WISE tables)--> KeyedTensor

Every table is ROW_WISE, its managed-collision module cut with it (rectoolkit.distributed.mc_modules). Evicted
rows keep their weights, as in the unsharded collection (TorchRec's sharded one re-initializes them: not done
here). Under DistributedModelParallel a plan keyed by the collection's path (TorchRec's) or by its inner
`_embedding_module` is accepted; the managed-collision state stays local to each rank (its row block's slots).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.interfaces import ShardedModule
from rectoolkit.distributed.mc_modules import ManagedCollisionCollectionSharder, ShardedManagedCollisionCollection
from rectoolkit.distributed.sharded_ebc import shard_embedding_bag_collection
from rectoolkit.distributed.sharded_ec import shard_embedding_collection
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection
from rectoolkit.modules.mc_embedding_modules import (
    BaseManagedCollisionEmbeddingCollection, ManagedCollisionEmbeddingBagCollection)
from rectoolkit.plan.types import EmbeddingComputeKernel, ParameterSharding, ShardingType
from rectoolkit.sparse import KeyedJaggedTensor


class ShardedManagedCollisionLookup(ShardedModule):
    """Remap on the row blocks' owners, then the sharded lookup: returns (the sharded collection's awaitable,
    remapped KJT or None), as TorchRec's. The bag and sequence versions below differ only in the lookup."""

    def __init__(self, module: BaseManagedCollisionEmbeddingCollection, module_plan: Mapping[str, ParameterSharding],
                 env: ShardingEnv, fused_params: Optional[Mapping[str, Any]] = None,
                 torchrec_default_optimizer: bool = False,
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self.env = env
        self._managed_collision_collection = ShardedManagedCollisionCollection(
            module._managed_collision_collection, module_plan, env)
        shard = (shard_embedding_bag_collection if isinstance(module._embedding_module, EmbeddingBagCollection)
                 else shard_embedding_collection)
        self._embedding_module = shard(module._embedding_module, module_plan, env, fused_params=fused_params,
                                       torchrec_default_optimizer=torchrec_default_optimizer,
                                       qcomm_codecs_registry=qcomm_codecs_registry)
        self._return_remapped_features = module._return_remapped_features

    def forward(self, features: KeyedJaggedTensor) -> Tuple[Any, Optional[KeyedJaggedTensor]]:
        """(the embeddings' awaitable, the remapped features if the collection returns them)."""
        remapped = self._managed_collision_collection(features)
        return self._embedding_module(remapped), (remapped if self._return_remapped_features else None)


class ShardedManagedCollisionEmbeddingBagCollection(ShardedManagedCollisionLookup):
    """A ManagedCollisionEmbeddingBagCollection sharded row-wise: (awaitable KeyedTensor, remapped KJT or None)."""


class ManagedCollisionEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """Shards ManagedCollisionEmbeddingBagCollection: ROW_WISE only (TorchRec's sharder offers the same).

    >>> ManagedCollisionEmbeddingBagCollectionSharder().sharding_types("cpu")
    ['row_wise']
    """

    module_type = ManagedCollisionEmbeddingBagCollection
    sharded_type = ShardedManagedCollisionEmbeddingBagCollection
    _types = [ShardingType.ROW_WISE]
    _inner_sharder = EmbeddingBagCollectionSharder

    def __init__(self, ebc_sharder: Optional[EmbeddingBagCollectionSharder] = None,
                 mc_sharder: Optional[ManagedCollisionCollectionSharder] = None,
                 fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        """TorchRec's arguments: the embedding collection's sharder (its fused_params and qcomm_codecs_registry are
        the shards'; default: one of `fused_params` and `qcomm_codecs_registry`) and the managed-collision
        collection's (default: a ManagedCollisionCollectionSharder)."""
        subject = type(self).__name__
        if ebc_sharder is not None and not isinstance(ebc_sharder, self._inner_sharder):
            raise TypeError(f"{subject}: the first argument is the embedding collection's sharder (a "
                            f"{self._inner_sharder.__name__}), got a {type(ebc_sharder).__name__}; pass fused_params "
                            "by keyword")
        if ebc_sharder is not None and fused_params is not None:
            raise ValueError(f"{subject}: both a sharder and fused_params given; give fused_params to the sharder "
                             f"({self._inner_sharder.__name__}(fused_params=...)): TorchRec uses the sharder's alone")
        if mc_sharder is not None and not isinstance(mc_sharder, ManagedCollisionCollectionSharder):
            raise TypeError(f"{subject}: mc_sharder must be a ManagedCollisionCollectionSharder, got a "
                            f"{type(mc_sharder).__name__}")
        inner = ebc_sharder if ebc_sharder is not None else self._inner_sharder(fused_params, qcomm_codecs_registry)
        codecs = qcomm_codecs_registry if qcomm_codecs_registry is not None else inner.qcomm_codecs_registry
        super().__init__(inner.fused_params, codecs)
        self._mc_sharder = mc_sharder if mc_sharder is not None else ManagedCollisionCollectionSharder()

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        """TorchRec's list on every device, in its order (without its "key_value": rectoolkit has no such kernel)."""
        super().compute_kernels(sharding_type, compute_device_type)  # refuses another type or device, naming them
        return [EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.FUSED_UVM_CACHING.value,
                EmbeddingComputeKernel.FUSED_UVM.value]

    def shard(self, module: nn.Module, params: Mapping[str, Any], env: Any, device: Any = None,
              module_fqn: Optional[str] = None) -> ShardedManagedCollisionLookup:
        """The sharded collection (this rank's row blocks and their managed-collision modules)."""
        if not isinstance(module, self.module_type):
            raise TypeError(f"{type(self).__name__}.shard: got a {type(module).__name__}, this sharder shards "
                            f"{self.module_type.__name__}")
        if not isinstance(env, ShardingEnv):
            env = ShardingEnv.from_process_group(env, device=device)
        sharded = self.sharded_type(module, dict(params), env, fused_params=self.fused_params,
                                    torchrec_default_optimizer=True, qcomm_codecs_registry=self.qcomm_codecs_registry)
        sharded.module_fqn = module_fqn
        return sharded


def sharded_mc_buffers(module: nn.Module) -> Dict[str, Any]:
    """Full names of the managed-collision state inside `module`: per rank, so DDP must not broadcast it."""
    return {f"{path}.{name}" if path else name: buffer for path, sub in module.named_modules()
            if isinstance(sub, ShardedManagedCollisionCollection) for name, buffer in sub.named_buffers()}
