"""TorchRec's module path torchrec.modules.embedding_configs (a path module: re-exports only, see
rectoolkit.compat). The configs live in rectoolkit.modules.configs, QuantConfig in rectoolkit.quant.config."""

from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.quant.config import QuantConfig

__all__ = ["BaseEmbeddingConfig", "DataType", "EmbeddingBagConfig", "EmbeddingConfig", "PoolingType", "QuantConfig"]
