"""TorchRec's path torchrec.distributed.quant_embeddingbag (a path module, see rectoolkit.compat): the sharder and
the sharded quantized EmbeddingBagCollection for inference, which live in rectoolkit.quant.sharding."""

from rectoolkit.quant.sharding import QuantEmbeddingBagCollectionSharder, ShardedQuantEmbeddingBagCollection

__all__ = ["QuantEmbeddingBagCollectionSharder", "ShardedQuantEmbeddingBagCollection"]
