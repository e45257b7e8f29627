"""TorchRec's torchrec.inference: quantize a trained model and shard it for serving (see inference.modules), and
package a PredictFactory for a model server (inference.model_packager)."""

from rectoolkit.inference import model_packager, modules
from rectoolkit.inference.modules import (assign_weights_to_tbe, get_table_to_weights_from_tbe, quantize_inference_model,
                                          set_pruning_data, shard_quant_model)

__all__ = ["assign_weights_to_tbe", "get_table_to_weights_from_tbe", "model_packager", "modules", "quantize_inference_model",
           "set_pruning_data", "shard_quant_model"]
