"""TorchRec's torchrec.inference: quantize a trained model and shard it for serving (see inference.modules)."""

from rectoolkit.inference import modules
from rectoolkit.inference.modules import quantize_inference_model, shard_quant_model

__all__ = ["modules", "quantize_inference_model", "shard_quant_model"]
