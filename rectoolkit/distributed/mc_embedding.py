"""A ManagedCollisionEmbeddingCollection sharded row-wise (TorchRec's `torchrec.distributed.mc_embedding`): as
mc_embeddingbag.py, with a sharded EmbeddingCollection (sequence embeddings) as the lookup.

    >>> ManagedCollisionEmbeddingCollectionSharder().sharding_types("cuda")
    ['row_wise']
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from rectoolkit.distributed.mc_embeddingbag import (
    ManagedCollisionEmbeddingBagCollectionSharder, ShardedManagedCollisionLookup)
from rectoolkit.distributed.mc_modules import ManagedCollisionCollectionSharder
from rectoolkit.distributed.sharders import EmbeddingCollectionSharder
from rectoolkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection


class ShardedManagedCollisionEmbeddingCollection(ShardedManagedCollisionLookup):
    """A ManagedCollisionEmbeddingCollection sharded row-wise: (awaitable dict of JaggedTensors, remapped KJT or
    None)."""


class ManagedCollisionEmbeddingCollectionSharder(ManagedCollisionEmbeddingBagCollectionSharder):
    """Shards ManagedCollisionEmbeddingCollection: ROW_WISE only."""

    module_type = ManagedCollisionEmbeddingCollection
    sharded_type = ShardedManagedCollisionEmbeddingCollection
    _inner_sharder = EmbeddingCollectionSharder

    def __init__(self, ec_sharder: Optional[EmbeddingCollectionSharder] = None,
                 mc_sharder: Optional[ManagedCollisionCollectionSharder] = None,
                 fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        """TorchRec's arguments (the sequence collection's sharder first)."""
        super().__init__(ec_sharder, mc_sharder, fused_params, qcomm_codecs_registry)
