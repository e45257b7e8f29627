"""TorchRec's quantization preparation (`torchrec.quant.embedding_modules`): marks set on float modules before they
are quantized, read by `from_float`, and `quantize_state_dict`.

    quant_prep_customize_row_alignment(model, [EmbeddingBagCollection], 32)   # stored rows padded to 32 bytes
    quantize_inference_model(model)                                            # from_float reads the mark

The marks are TorchRec's attribute names, so a model prepared by TorchRec's functions reads the same here:
row alignment (honoured), register_tbes and cache_features_order (accepted: rectoolkit's lookups are always
registered modules, and it keeps no feature order cache), split scale / bias state dicts (refused by from_float).

    >>> import torch, rectoolkit as rtk
    >>> model = torch.nn.Sequential(rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(
    ...     name="t", num_embeddings=4, embedding_dim=8, feature_names=["f"])]))
    >>> quant_prep_customize_row_alignment(model, [rtk.EmbeddingBagCollection], 32)
    >>> getattr(model[0], MODULE_ATTR_ROW_ALIGNMENT_INT)
    32
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple, Type

import torch
from torch import nn

from rectoolkit.modules.configs import DataType
from rectoolkit.quant.rowwise import FLOAT_DATA_TYPES, SCALE_BIAS_BYTES, data_bytes_per_row, quantize_rowwise

# TorchRec's attribute names (torchrec.quant.embedding_modules)
MODULE_ATTR_REGISTER_TBES_BOOL: str = "__register_tbes_in_named_modules"
MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS: str = "__quant_state_dict_split_scale_bias"
MODULE_ATTR_ROW_ALIGNMENT_INT: str = "__register_row_alignment_in_named_modules"
MODULE_ATTR_CACHE_FEATURES_ORDER: str = "__cache_features_order"


def for_each_module_of_type_do(module: nn.Module, module_types: List[Type[nn.Module]],
                               op: Callable[[nn.Module], None]) -> None:
    """`op(m)` for every module of `module` (itself included) that is an instance of one of `module_types`."""
    for sub in module.modules():
        if any(isinstance(sub, kind) for kind in module_types):
            op(sub)


def quant_prep_enable_quant_state_dict_split_scale_bias(module: nn.Module) -> None:
    """Mark `module` for state dicts with scale and bias apart (from_float then refuses it: rectoolkit keeps them in
    each stored row, TorchRec's default layout)."""
    setattr(module, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, True)


def quant_prep_enable_quant_state_dict_split_scale_bias_for_types(module: nn.Module,
                                                                   module_types: List[Type[nn.Module]]) -> None:
    for_each_module_of_type_do(module, module_types,
                               lambda m: setattr(m, MODULE_ATTR_QUANT_STATE_DICT_SPLIT_SCALE_BIAS, True))


def quant_prep_enable_register_tbes(module: nn.Module, module_types: List[Type[nn.Module]]) -> None:
    for_each_module_of_type_do(module, module_types, lambda m: setattr(m, MODULE_ATTR_REGISTER_TBES_BOOL, True))


def quant_prep_customize_row_alignment(module: nn.Module, module_types: List[Type[nn.Module]],
                                       row_alignment: int) -> None:
    """Stored rows of the quantized forms of these modules padded to `row_alignment` bytes (TorchRec's default 16)."""
    if isinstance(row_alignment, bool) or not isinstance(row_alignment, int) or row_alignment < 1:
        raise ValueError(f"quant_prep_customize_row_alignment: row_alignment={row_alignment!r}; give a positive int "
                         "number of bytes")
    for_each_module_of_type_do(module, module_types, lambda m: setattr(m, MODULE_ATTR_ROW_ALIGNMENT_INT, row_alignment))


def quant_prep_enable_cache_features_order(module: nn.Module, module_types: List[Type[nn.Module]]) -> None:
    for_each_module_of_type_do(module, module_types, lambda m: setattr(m, MODULE_ATTR_CACHE_FEATURES_ORDER, True))


def quantize_state_dict(module: nn.Module,
                        table_name_to_quantized_weights: Dict[str, Tuple[torch.Tensor, Optional[torch.Tensor]]],
                        table_name_to_data_type: Dict[str, DataType],
                        table_name_to_num_embeddings_post_pruning: Optional[Dict[str, int]] = None) -> torch.device:
    """TorchRec's: every "<...>.<table>.weight" of `module`'s state_dict quantized into
    `table_name_to_quantized_weights[table] = (weight, scale_shift)` as fbgemm's fused rowwise quantizer splits it:
    INT8 / INT4 / INT2 codes uint8 [rows, dim * bits / 8] with fp16 scale and bias bytes uint8 [rows, 4]; FP16 /
    FP32 the values' bytes and None. Tables named in `table_name_to_num_embeddings_post_pruning` keep their first
    rows. A meta weight gives empty meta tensors of those shapes. Returns the device of the weights."""
    device = torch.device("cpu")
    rows_kept = table_name_to_num_embeddings_post_pruning or {}
    for key, tensor in module.state_dict().items():
        parts = key.split(".")
        if parts[-1] != "weight" or len(parts) < 2:
            raise ValueError(f"quantize_state_dict: state_dict key {key!r} is no table weight "
                             "('<...>.<table>.weight'); pass an EmbeddingBagCollection or EmbeddingCollection")
        table = parts[-2]
        if table not in table_name_to_data_type:
            raise ValueError(f"quantize_state_dict: no data type for table {table!r}; table_name_to_data_type names "
                             f"{sorted(table_name_to_data_type)}")
        data_type = DataType(table_name_to_data_type[table].value if hasattr(table_name_to_data_type[table], "value")
                             else table_name_to_data_type[table])
        num_rows = rows_kept.get(table, tensor.shape[0])
        device = tensor.device
        nbytes = data_bytes_per_row(tensor.shape[1], data_type)
        integer = data_type not in FLOAT_DATA_TYPES
        if tensor.is_meta:
            weight = torch.empty((num_rows, nbytes), device="meta", dtype=torch.uint8)
            scale_shift = torch.empty((num_rows, SCALE_BIAS_BYTES), device="meta", dtype=torch.uint8) if integer else None
        else:
            rows = quantize_rowwise(tensor[:num_rows].detach(), data_type, row_alignment=1)
            if integer:  # stored rows hold scale and bias first; fbgemm's split puts them apart
                weight, scale_shift = rows[:, SCALE_BIAS_BYTES:SCALE_BIAS_BYTES + nbytes], rows[:, :SCALE_BIAS_BYTES]
            else:
                weight, scale_shift = rows[:, :nbytes], None
        table_name_to_quantized_weights[table] = (weight, scale_shift)
    return device
