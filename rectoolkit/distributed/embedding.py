"""TorchRec's path torchrec.distributed.embedding (a path module, see rectoolkit.compat): the sharder and the
sharded EmbeddingCollection."""

from rectoolkit.distributed.sharded_ec import ShardedEmbeddingCollection
from rectoolkit.distributed.sharders import EmbeddingCollectionSharder

__all__ = ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"]
