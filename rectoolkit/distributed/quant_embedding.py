"""TorchRec's path torchrec.distributed.quant_embedding (a path module, see rectoolkit.compat): the sharder and the
sharded quantized EmbeddingCollection for inference, which live in rectoolkit.quant.sharding."""

from rectoolkit.quant.sharding import QuantEmbeddingCollectionSharder, ShardedQuantEmbeddingCollection

__all__ = ["QuantEmbeddingCollectionSharder", "ShardedQuantEmbeddingCollection"]
