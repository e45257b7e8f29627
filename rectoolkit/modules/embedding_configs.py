"""TorchRec's module path torchrec.modules.embedding_configs (a path module: re-exports only, see
rectoolkit.compat). The configs live in rectoolkit.modules.configs, QuantConfig in rectoolkit.quant.config."""

from rectoolkit.modules.configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbeddingTableConfig,
    PoolingType,
    data_type_to_dtype,
    dtype_to_data_type,
    pooling_type_to_str,
)
from rectoolkit.quant.config import QuantConfig

__all__ = ["BaseEmbeddingConfig", "DataType", "EmbeddingBagConfig", "EmbeddingConfig", "EmbeddingTableConfig",
           "PoolingType", "QuantConfig", "data_type_to_dtype", "dtype_to_data_type", "pooling_type_to_str"]
