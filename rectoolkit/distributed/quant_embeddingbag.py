"""TorchRec's path torchrec.distributed.quant_embeddingbag (a path module, see rectoolkit.compat): the sharders and
the sharded quantized (and quantized feature-processed) EmbeddingBagCollections for inference, which live in
rectoolkit.quant.sharding."""

from rectoolkit.quant.sharding import (QuantEmbeddingBagCollectionSharder,
                                       QuantFeatureProcessedEmbeddingBagCollectionSharder,
                                       ShardedQuantEmbeddingBagCollection,
                                       ShardedQuantFeatureProcessedEmbeddingBagCollection)

__all__ = ["QuantEmbeddingBagCollectionSharder", "QuantFeatureProcessedEmbeddingBagCollectionSharder",
           "ShardedQuantEmbeddingBagCollection", "ShardedQuantFeatureProcessedEmbeddingBagCollection"]
