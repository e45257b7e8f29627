"""The quantized FeatureProcessedEmbeddingBagCollection (TorchRec's `torchrec.quant.embedding_modules.
FeatureProcessedEmbeddingBagCollection`): the float collection's feature processors, kept as they are, in front of
a quantized EmbeddingBagCollection of its tables.

    KJT --feature processors (float)--> KJT with per-id weights --QuantEmbeddingBagCollection--> KeyedTensor

`quantize_inference_model` swaps every float FeatureProcessedEmbeddingBagCollection for one, its tables stored as
`fp_weight_dtype` (TorchRec's default int8):

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.modules.feature_processor_ import PositionWeightedModuleCollection
    >>> from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection as FloatFP
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4,
    ...                                                          feature_names=["hist"])], is_weighted=True)
    >>> quantized = QuantFeatureProcessedEmbeddingBagCollection.from_float(
    ...     FloatFP(ebc, PositionWeightedModuleCollection({"hist": 3})), dtype=torch.int8)
    >>> sorted(quantized.state_dict())
    ['embedding_bags.t.weight', 'feature_processor.position_weights.hist']
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.modules.feature_processor_ import FeatureProcessorsCollection
from rectoolkit.quant.embedding_modules import (DEFAULT_ROW_ALIGNMENT, QuantEmbeddingBagCollection,
                                                quantized_bag_collection)
from rectoolkit.sparse import KeyedJaggedTensor, KeyedTensor


class QuantFeatureProcessedEmbeddingBagCollection(QuantEmbeddingBagCollection):
    """A QuantEmbeddingBagCollection whose per-id weights come from `feature_processor` (a
    FeatureProcessorsCollection, required, though last of TorchRec's arguments). Other arguments as
    QuantEmbeddingBagCollection's, in TorchRec's order."""

    def __init__(self, tables: List[EmbeddingBagConfig], is_weighted: bool,
                 device: Union[str, torch.device, None] = None, output_dtype: torch.dtype = torch.float,
                 table_name_to_quantized_weights: Optional[Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]]] = None,
                 register_tbes: bool = False, quant_state_dict_split_scale_bias: bool = False,
                 row_alignment: int = DEFAULT_ROW_ALIGNMENT,
                 feature_processor: Optional[FeatureProcessorsCollection] = None,
                 cache_features_order: bool = False, *, backend: str = "auto",
                 ids_out_of_range: str = "error") -> None:
        if feature_processor is None:
            raise ValueError("QuantFeatureProcessedEmbeddingBagCollection: feature_processor is None; use "
                             "QuantEmbeddingBagCollection for a collection without feature processors")
        if not isinstance(feature_processor, nn.Module):
            raise TypeError(f"QuantFeatureProcessedEmbeddingBagCollection: feature_processor must be a "
                            f"FeatureProcessorsCollection (an nn.Module), got a {type(feature_processor).__name__}")
        super().__init__(tables, is_weighted, device, output_dtype, table_name_to_quantized_weights, register_tbes,
                         quant_state_dict_split_scale_bias, row_alignment, cache_features_order, backend=backend,
                         ids_out_of_range=ids_out_of_range)
        self.feature_processor = feature_processor

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        return super().forward(self.feature_processor(features))

    def _get_name(self) -> str:
        return "QuantFeatureProcessedEmbeddingBagCollection"

    @classmethod
    def from_float(cls, module: nn.Module, use_precomputed_fake_quant: bool = False, *,
                   dtype: Union[torch.dtype, str, None] = None,
                   per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None,
                   output_dtype: Optional[torch.dtype] = None, backend: str = "auto",
                   row_alignment: Optional[int] = None) -> "QuantFeatureProcessedEmbeddingBagCollection":
        """Quantize a float FeatureProcessedEmbeddingBagCollection: its tables as QuantEmbeddingBagCollection.from_float
        stores them (`dtype`, or the module's qconfig as quantize_inference_model sets it), its feature processors
        kept (the same module objects; a per-feature dict as one collection)."""
        from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

        if not isinstance(module, FeatureProcessedEmbeddingBagCollection):
            raise TypeError(f"QuantFeatureProcessedEmbeddingBagCollection.from_float: takes a rectoolkit "
                            f"FeatureProcessedEmbeddingBagCollection, got a {type(module).__name__}")
        processors, ebc = module.split()
        return quantized_bag_collection(cls, ebc, module, dtype=dtype, per_table_weight_dtype=per_table_weight_dtype,
                                        output_dtype=output_dtype, backend=backend, row_alignment=row_alignment,
                                        feature_processor=processors)
