"""Quantized embedding collections for inference (TorchRec's torchrec.quant), and export for serving."""

from rectoolkit.quant.config import QuantConfig, make_qconfig, weight_data_type
from rectoolkit.quant.embedding_modules import (
    QuantEmbeddingBagCollection,
    QuantEmbeddingCollection,
    quantize_embeddings,
)
from rectoolkit.quant.fp_embedding_modules import QuantFeatureProcessedEmbeddingBagCollection
from rectoolkit.quant.export import (
    ServingModule,
    export_for_serving,
    register_jagged_pytree_nodes,
    save_for_serving,
    serving_inputs,
)
from rectoolkit.quant.lookup import QuantBatchedLookup, QuantTableSpec
from rectoolkit.quant.rowwise import (
    DEFAULT_ROW_ALIGNMENT,
    QUANT_DATA_TYPES,
    dequantize_rowwise,
    quantize_rowwise,
    row_size_in_bytes,
    slice_columns_rowwise,
    split_scale_bias,
    table_size_in_bytes,
    unpadded_row_size_in_bytes,
)
from rectoolkit.quant.sizes import (
    bytes_per_table,
    quantized_row_bytes,
    quantized_table_bytes,
    shard_bytes,
    table_bytes_by_data_type,
)
