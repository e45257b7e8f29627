"""TorchRec's module path torchrec.modules.embedding_configs (a path module: re-exports only, see
rectoolkit.compat). The configs live in rectoolkit.modules.configs, QuantConfig in rectoolkit.quant.config."""

from rectoolkit.modules.configs import (
    BaseEmbeddingConfig,
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    EmbeddingTableConfig,
    PoolingType,
    ShardingType,
    data_type_to_dtype,
    data_type_to_sparse_type,
    dtype_to_data_type,
    pooling_type_to_pooling_mode,
    pooling_type_to_str,
)
from rectoolkit.quant.config import QuantConfig

__all__ = ["BaseEmbeddingConfig", "DataType", "EmbeddingBagConfig", "EmbeddingConfig", "EmbeddingTableConfig",
           "PoolingType", "QuantConfig", "ShardingType", "data_type_to_dtype", "data_type_to_sparse_type",
           "dtype_to_data_type", "pooling_type_to_pooling_mode", "pooling_type_to_str"]
