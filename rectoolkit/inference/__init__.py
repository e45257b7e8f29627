"""TorchRec's torchrec.inference: quantize a trained model and shard it for serving (see inference.modules)."""

from rectoolkit.inference import modules
from rectoolkit.inference.modules import (assign_weights_to_tbe, get_table_to_weights_from_tbe, quantize_inference_model,
                                          set_pruning_data, shard_quant_model)

__all__ = ["assign_weights_to_tbe", "get_table_to_weights_from_tbe", "modules", "quantize_inference_model",
           "set_pruning_data", "shard_quant_model"]
