"""TorchRec's module path torchrec.distributed.embeddingbag: the sharder and the sharded EmbeddingBagCollection."""

from rectoolkit.distributed.sharded_ebc import ShardedEmbeddingBagCollection
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder

__all__ = ["EmbeddingBagCollectionSharder", "ShardedEmbeddingBagCollection"]
