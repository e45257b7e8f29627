"""Embedding modules with TorchRec's names: table configs, EmbeddingBagCollection, EmbeddingCollection."""

from rectoolkit.modules.configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
