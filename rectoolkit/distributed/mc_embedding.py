"""A ManagedCollisionEmbeddingCollection sharded row-wise (TorchRec's `torchrec.distributed.mc_embedding`): as
mc_embeddingbag.py, with a sharded EmbeddingCollection (sequence embeddings) as the lookup.

    >>> ManagedCollisionEmbeddingCollectionSharder().sharding_types("cuda")
    ['row_wise']
"""

from __future__ import annotations

from rectoolkit.distributed.mc_embeddingbag import (
    ManagedCollisionEmbeddingBagCollectionSharder, ShardedManagedCollisionLookup)
from rectoolkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingCollection


class ShardedManagedCollisionEmbeddingCollection(ShardedManagedCollisionLookup):
    """A ManagedCollisionEmbeddingCollection sharded row-wise: (awaitable dict of JaggedTensors, remapped KJT or
    None)."""


class ManagedCollisionEmbeddingCollectionSharder(ManagedCollisionEmbeddingBagCollectionSharder):
    """Shards ManagedCollisionEmbeddingCollection: ROW_WISE only."""

    module_type = ManagedCollisionEmbeddingCollection
    sharded_type = ShardedManagedCollisionEmbeddingCollection
