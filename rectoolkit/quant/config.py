"""QuantConfig (TorchRec's) and the mapping from torch dtypes to table storage types.

    >>> import torch
    >>> from torch.ao import quantization as quant
    >>> qconfig = QuantConfig(activation=quant.PlaceholderObserver.with_args(dtype=torch.float),
    ...                       weight=quant.PlaceholderObserver.with_args(dtype=torch.int8))
    >>> weight_data_type(torch.quint4x2), weight_data_type("int8")
    (<DataType.INT4: 'INT4'>, <DataType.INT8: 'INT8'>)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, NamedTuple, Optional, Union

import torch

from rectoolkit.modules.configs import DataType
from rectoolkit.quant.rowwise import QUANT_DATA_TYPES

# torch dtypes a user may name for the stored weights (TorchRec's choices, plus plain spellings).
_WEIGHT_DTYPES: Dict[torch.dtype, DataType] = {
    torch.int8: DataType.INT8,
    torch.uint8: DataType.INT8,
    torch.qint8: DataType.INT8,
    torch.quint8: DataType.INT8,
    torch.quint4x2: DataType.INT4,
    torch.quint2x4: DataType.INT2,
    torch.float16: DataType.FP16,
    torch.float32: DataType.FP32,
}


class QuantConfig(NamedTuple):
    """What to quantize to, as in TorchRec: `activation` (output dtype) and `weight` (stored dtype) observers.

    `per_table_weight_dtype` maps table names to a storage dtype that overrides `weight` for that table.
    """

    activation: Callable[[], Any]
    weight: Callable[[], Any]
    per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None


def weight_data_type(dtype: Union[torch.dtype, DataType, str]) -> DataType:
    """The DataType that stores a table quantized to `dtype` (torch dtype, DataType or name like "int4")."""
    if isinstance(dtype, DataType):
        data_type = dtype
    elif isinstance(dtype, str):
        try:
            data_type = DataType(dtype.upper())
        except ValueError:
            raise ValueError(f"unknown weight dtype {dtype!r}; use one of {[d.value for d in QUANT_DATA_TYPES]}") from None
    elif dtype in _WEIGHT_DTYPES:
        data_type = _WEIGHT_DTYPES[dtype]
    else:
        raise ValueError(
            f"cannot store embedding weights as {dtype}; use torch.int8, torch.quint4x2 (INT4), "
            "torch.quint2x4 (INT2), torch.float16 or torch.float32"
        )
    if data_type not in QUANT_DATA_TYPES:
        raise ValueError(f"cannot store embedding weights as {data_type}; use one of {[d.value for d in QUANT_DATA_TYPES]}")
    return data_type


def make_qconfig(dtype: Union[torch.dtype, DataType, str] = torch.int8, output_dtype: torch.dtype = torch.float,
                 per_table_weight_dtype: Optional[Dict[str, torch.dtype]] = None) -> QuantConfig:
    """The seed-001 QuantConfig in one call: PlaceholderObservers for the output and weight dtypes."""
    from torch.ao.quantization import PlaceholderObserver

    weight_dtype = dtype
    if not isinstance(dtype, torch.dtype):
        weight_dtype = {DataType.INT8: torch.int8, DataType.INT4: torch.quint4x2, DataType.INT2: torch.quint2x4,
                        DataType.FP16: torch.float16, DataType.FP32: torch.float32}[weight_data_type(dtype)]
    return QuantConfig(activation=PlaceholderObserver.with_args(dtype=output_dtype),
                       weight=PlaceholderObserver.with_args(dtype=weight_dtype),
                       per_table_weight_dtype=per_table_weight_dtype)
