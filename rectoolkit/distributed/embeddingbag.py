"""TorchRec's path torchrec.distributed.embeddingbag (a path module, see rectoolkit.compat): the sharder and
the sharded EmbeddingBagCollection."""

from rectoolkit.distributed.sharded_ebc import ShardedEmbeddingBagCollection
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder

__all__ = ["EmbeddingBagCollectionSharder", "ShardedEmbeddingBagCollection"]
