"""TorchRec's module path for the table configs (torchrec.modules.embedding_configs); they live in
rectoolkit.modules.configs, and QuantConfig in rectoolkit.quant.config."""

from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.quant.config import QuantConfig

__all__ = ["BaseEmbeddingConfig", "DataType", "EmbeddingBagConfig", "EmbeddingConfig", "PoolingType", "QuantConfig"]
