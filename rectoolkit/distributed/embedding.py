"""TorchRec's module path torchrec.distributed.embedding: the sharder and the sharded EmbeddingCollection."""

from rectoolkit.distributed.sharded_ec import ShardedEmbeddingCollection
from rectoolkit.distributed.sharders import EmbeddingCollectionSharder

__all__ = ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"]
