"""Row-wise quantization of embedding tables, byte for byte as fbgemm's inference TBE stores them.

Every row of a quantized table is one run of bytes (TorchRec's `QuantEmbeddingBagCollection` state_dict):

    INT8 / INT4 / INT2:  [scale fp16][bias fp16][D * bits / 8 packed codes][zero padding to row_alignment]
    FP16 / FP32:         [D values][zero padding to row_alignment]

so an fp32 table of 4096 x 64 becomes 4096 x 80 uint8 for INT8 (4 + 64 = 68 bytes, padded to 80).
Codes are unsigned: value = scale * code + bias, with bias = the row's minimum (rounded to fp16) and
scale = (max - min) / (2**bits - 1) (rounded to fp16). INT4 / INT2 pack the lowest column in the low bits.

    >>> import torch
    >>> w = torch.tensor([[-1.0, 84.0, 169.0, 254.0]])
    >>> rows = quantize_rowwise(w, DataType.INT8, backend="torch")
    >>> tuple(rows.shape), rows[0, 4:8].tolist()        # 4 + 4 bytes -> padded to 16; scale 1, bias -1
    ((1, 16), [0, 85, 170, 255])
    >>> dequantize_rowwise(rows, DataType.INT8, embedding_dim=4)
    tensor([[ -1.,  84., 169., 254.]])

Two implementations give the same bytes: pure torch (always there) and fbgemm's
`FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf` (when `rectoolkit.kernels.fbgemm_available()`).
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.kernels.backend import fbgemm_available
from rectoolkit.modules.configs import DATA_TYPE_NUM_BITS, DataType

DEFAULT_ROW_ALIGNMENT = 16
SCALE_BIAS_BYTES = 4  # one fp16 scale + one fp16 bias per row
INTEGER_DATA_TYPES = (DataType.INT8, DataType.INT4, DataType.INT2)
FLOAT_DATA_TYPES = (DataType.FP16, DataType.FP32)
QUANT_DATA_TYPES = INTEGER_DATA_TYPES + FLOAT_DATA_TYPES

# fbgemm's SparseType integers, used by its lookup op (weights_tys).
SPARSE_TYPE_INT = {DataType.FP32: 0, DataType.FP16: 1, DataType.INT8: 2, DataType.INT4: 3, DataType.INT2: 4}


def _check_data_type(data_type: DataType) -> DataType:
    if isinstance(data_type, str):
        data_type = DataType(data_type.upper())
    if data_type not in QUANT_DATA_TYPES:
        raise ValueError(
            f"row-wise quantization supports {[d.value for d in QUANT_DATA_TYPES]}, got {data_type}; "
            "pick one of those for the table's data_type"
        )
    return data_type


def _check_dim(embedding_dim: int, data_type: DataType) -> None:
    codes_per_byte = 8 // DATA_TYPE_NUM_BITS[data_type] if data_type in INTEGER_DATA_TYPES else 1
    if embedding_dim % codes_per_byte != 0:
        raise ValueError(
            f"{data_type.value} packs {codes_per_byte} columns per byte, so embedding_dim must be a multiple of "
            f"{codes_per_byte}; got {embedding_dim}. Use INT8 (or FP16) for this table."
        )


def data_bytes_per_row(embedding_dim: int, data_type: DataType) -> int:
    """Bytes of the values (codes) of one row, without scale/bias or padding."""
    data_type = _check_data_type(data_type)
    return embedding_dim * DATA_TYPE_NUM_BITS[data_type] // 8


def unpadded_row_size_in_bytes(embedding_dim: int, data_type: DataType) -> int:
    """Bytes of one row before alignment padding: codes plus 4 bytes of fp16 scale and bias for INT types.

    >>> unpadded_row_size_in_bytes(64, DataType.INT8), unpadded_row_size_in_bytes(64, DataType.INT4)
    (68, 36)
    """
    data_type = _check_data_type(data_type)
    extra = SCALE_BIAS_BYTES if data_type in INTEGER_DATA_TYPES else 0
    return data_bytes_per_row(embedding_dim, data_type) + extra


def row_size_in_bytes(embedding_dim: int, data_type: DataType, row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> int:
    """Bytes of one stored row, padded to a multiple of `row_alignment` (fbgemm/TorchRec: 16).

    >>> [row_size_in_bytes(64, d) for d in (DataType.FP32, DataType.FP16, DataType.INT8, DataType.INT4, DataType.INT2)]
    [256, 128, 80, 48, 32]
    """
    if row_alignment <= 0:
        raise ValueError(f"row_alignment must be a positive number of bytes, got {row_alignment}")
    unpadded = unpadded_row_size_in_bytes(embedding_dim, data_type)
    return (unpadded + row_alignment - 1) // row_alignment * row_alignment


def table_size_in_bytes(num_embeddings: int, embedding_dim: int, data_type: DataType,
                        row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> int:
    """Bytes of a whole stored table (rows x padded row size)."""
    return num_embeddings * row_size_in_bytes(embedding_dim, data_type, row_alignment)


# ---------------------------------------------------------------------------------------------- pure torch
def _scale_bias_torch(weight: torch.Tensor, num_bits: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp16 scale and bias per row, computed in fp32 exactly as fbgemm's reference quantizer does."""
    minimum = weight.amin(dim=1)
    maximum = weight.amax(dim=1)
    bias_fp16 = minimum.to(torch.float16)  # the bias is stored in fp16; the max keeps full precision
    minimum = bias_fp16.to(torch.float32)
    value_range = maximum - minimum
    scale = torch.where(value_range == 0, torch.ones_like(value_range), value_range / float((1 << num_bits) - 1))
    scale = scale.to(torch.float16).to(torch.float32)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    inverse_scale = 1.0 / scale
    is_inf = torch.isinf(inverse_scale)
    scale = torch.where(is_inf, torch.ones_like(scale), scale)
    return scale, minimum, bias_fp16


def _quantize_codes_torch(weight: torch.Tensor, num_bits: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed codes uint8 [R, D*bits/8], scale fp16 [R], bias fp16 [R])."""
    weight = weight.to(torch.float32)
    scale, minimum, bias_fp16 = _scale_bias_torch(weight, num_bits)
    inverse_scale = 1.0 / scale
    codes = torch.round((weight - minimum[:, None]) * inverse_scale[:, None]).clamp_(0, (1 << num_bits) - 1)
    codes = codes.to(torch.uint8)
    codes_per_byte = 8 // num_bits
    if codes_per_byte > 1:
        rows = codes.shape[0]
        codes = codes.view(rows, -1, codes_per_byte)
        shifts = torch.arange(codes_per_byte, dtype=torch.uint8, device=codes.device) * num_bits
        codes = (codes << shifts).sum(dim=2, dtype=torch.uint8)  # disjoint bits: sum == bitwise or
    return codes, scale.to(torch.float16), bias_fp16


def _assemble_rows(data: torch.Tensor, scale_bias: torch.Tensor | None, row_bytes: int) -> torch.Tensor:
    rows = torch.zeros(data.shape[0], row_bytes, dtype=torch.uint8, device=data.device)
    start = 0
    if scale_bias is not None:
        rows[:, :SCALE_BIAS_BYTES] = scale_bias
        start = SCALE_BIAS_BYTES
    rows[:, start:start + data.shape[1]] = data
    return rows


def _check_weight(weight: torch.Tensor) -> torch.Tensor:
    if weight.dim() != 2:
        raise ValueError(f"quantize_rowwise expects a 2-D table [rows, dim], got shape {tuple(weight.shape)}")
    if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"quantize_rowwise expects a float table, got dtype {weight.dtype}")
    return weight.detach()


def quantize_rowwise(weight: torch.Tensor, data_type: DataType, row_alignment: int = DEFAULT_ROW_ALIGNMENT,
                     backend: str = "auto") -> torch.Tensor:
    """Quantize a float table [R, D] into stored rows uint8 [R, row_size_in_bytes(D, data_type)].

    backend: "auto" (fbgemm's quantize op when available, else torch), "torch" or "fbgemm"; same bytes.
    """
    data_type = _check_data_type(data_type)
    weight = _check_weight(weight)
    num_rows, dim = weight.shape
    _check_dim(dim, data_type)
    row_bytes = row_size_in_bytes(dim, data_type, row_alignment)
    if data_type in FLOAT_DATA_TYPES:
        torch_dtype = torch.float16 if data_type == DataType.FP16 else torch.float32
        data = weight.to(torch_dtype).contiguous().view(torch.uint8).view(num_rows, -1)
        return _assemble_rows(data, None, row_bytes)
    num_bits = DATA_TYPE_NUM_BITS[data_type]
    if _use_fbgemm(backend) and weight.dtype != torch.bfloat16 and data_bytes_per_row(dim, data_type) % 2 == 0:
        fused = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(weight.contiguous(), num_bits)
        data, scale_bias = fused[:, :-SCALE_BIAS_BYTES], fused[:, -SCALE_BIAS_BYTES:]
    else:
        data, scale, bias = _quantize_codes_torch(weight, num_bits)
        scale_bias = torch.stack([scale, bias], dim=1).view(torch.uint8)
    return _assemble_rows(data, scale_bias, row_bytes)


def split_scale_bias(rows: torch.Tensor, data_type: DataType,
                     embedding_dim: int) -> Tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Views of stored rows: (codes or values uint8 [R, data bytes], scale fp16 [R], bias fp16 [R]).

    Scale and bias are None for FP16/FP32 tables.
    """
    data_type = _check_data_type(data_type)
    nbytes = data_bytes_per_row(embedding_dim, data_type)
    if data_type in FLOAT_DATA_TYPES:
        return rows[:, :nbytes], None, None
    return rows[:, SCALE_BIAS_BYTES:SCALE_BIAS_BYTES + nbytes], _fp16_at(rows, 0), _fp16_at(rows, 2)


def slice_columns_rowwise(rows: torch.Tensor, data_type: DataType, embedding_dim: int, col_start: int, col_end: int,
                          row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> torch.Tensor:
    """Stored rows of the columns [col_start, col_end) of a quantized table: the same codes, and each row's own
    scale and bias, so dequantizing them gives exactly those columns of the whole rows (how a column-wise shard
    of a quantized table is stored). The block's edges must fall on byte boundaries (even columns for INT4).

    >>> rows = quantize_rowwise(torch.tensor([[-1.0, 84.0, 169.0, 254.0]]), DataType.INT8, backend="torch")
    >>> dequantize_rowwise(slice_columns_rowwise(rows, DataType.INT8, 4, 2, 4), DataType.INT8, 2)
    tensor([[169., 254.]])
    """
    data_type = _check_data_type(data_type)
    if not 0 <= col_start < col_end <= embedding_dim:
        raise ValueError(f"columns [{col_start}, {col_end}) are not a block of a table of dim {embedding_dim}")
    for edge in (col_start, col_end):
        try:
            _check_dim(edge, data_type)
        except ValueError:
            raise ValueError(f"columns [{col_start}, {col_end}) of a {data_type.value} table: column {edge} is inside "
                             f"a byte ({8 // DATA_TYPE_NUM_BITS[data_type]} columns per byte); start and end the "
                             "block on a byte boundary") from None
    data, _, _ = split_scale_bias(rows, data_type, embedding_dim)
    bits = DATA_TYPE_NUM_BITS[data_type]
    block = data[:, col_start * bits // 8:col_end * bits // 8]
    scale_bias = rows[:, :SCALE_BIAS_BYTES] if data_type in INTEGER_DATA_TYPES else None
    return _assemble_rows(block, scale_bias, row_size_in_bytes(col_end - col_start, data_type, row_alignment))


def _fp16_at(rows: torch.Tensor, byte: int) -> torch.Tensor:
    """The little-endian fp16 stored at `byte` of each row (no dtype view of a 2-D slice, which torch.export
    would have to specialize for a single row)."""
    low = rows[:, byte].to(torch.int32)
    high = rows[:, byte + 1].to(torch.int32)
    return (low | (high << 8)).to(torch.int16).view(torch.float16)


def _dequantize_torch(rows: torch.Tensor, data_type: DataType, embedding_dim: int) -> torch.Tensor:
    data, scale, bias = split_scale_bias(rows, data_type, embedding_dim)
    if data_type in FLOAT_DATA_TYPES:
        torch_dtype = torch.float16 if data_type == DataType.FP16 else torch.float32
        data = data.contiguous()
        if data.storage_offset() % torch_dtype.itemsize:  # a view at an odd byte (row_alignment 1): copy first
            data = data.clone()
        return data.view(torch_dtype).to(torch.float32)
    codes = _unpack_codes(data, data_type, embedding_dim)
    return codes * scale.to(torch.float32)[:, None] + bias.to(torch.float32)[:, None]


def _unpack_codes(data: torch.Tensor, data_type: DataType, embedding_dim: int) -> torch.Tensor:
    """Packed codes uint8 [R, D * bits / 8] -> float32 [R, D] (lowest column in the low bits)."""
    num_bits = DATA_TYPE_NUM_BITS[data_type]
    codes_per_byte = 8 // num_bits
    if codes_per_byte > 1:
        shifts = torch.arange(codes_per_byte, dtype=torch.uint8, device=data.device) * num_bits
        data = ((data[:, :, None] >> shifts) & ((1 << num_bits) - 1)).reshape(data.shape[0], embedding_dim)
    return data.to(torch.float32)


def dequantize_rowwise(rows: torch.Tensor, data_type: DataType, embedding_dim: int,
                       backend: str = "auto") -> torch.Tensor:
    """Stored rows uint8 [R, row bytes] -> float32 [R, embedding_dim] (value = scale * code + bias)."""
    data_type = _check_data_type(data_type)
    if rows.dim() != 2 or rows.dtype != torch.uint8:
        raise ValueError(f"dequantize_rowwise expects uint8 rows [R, bytes], got {rows.dtype} {tuple(rows.shape)}")
    needed = unpadded_row_size_in_bytes(embedding_dim, data_type)
    if rows.shape[1] < needed:
        raise ValueError(
            f"{data_type.value} rows of dim {embedding_dim} need at least {needed} bytes, got {rows.shape[1]}; "
            "is embedding_dim or data_type wrong?"
        )
    if data_type in INTEGER_DATA_TYPES and _use_fbgemm(backend) and rows.shape[0] > 0:
        # fbgemm's CPU op reads scale/bias at the end of the row (its scale_bias_last=False is ignored on CPU)
        fused = torch.cat([rows[:, SCALE_BIAS_BYTES:needed], rows[:, :SCALE_BIAS_BYTES]], dim=1)
        return torch.ops.fbgemm.FusedNBitRowwiseQuantizedSBHalfToFloatOrHalf(fused, DATA_TYPE_NUM_BITS[data_type])
    return _dequantize_torch(rows, data_type, embedding_dim)


def _use_fbgemm(backend: str) -> bool:
    if backend == "torch":
        return False
    if backend == "fbgemm":
        if not fbgemm_available():
            raise RuntimeError("backend='fbgemm' but fbgemm_gpu is not available (or RECTOOLKIT_DISABLE_FBGEMM=1)")
        return True
    if backend == "auto":
        return fbgemm_available()
    raise ValueError(f"backend must be 'auto', 'torch' or 'fbgemm', got {backend!r}")


def max_abs_error_bound(weight: torch.Tensor, data_type: DataType) -> torch.Tensor:
    """Per-row bound on |w - dequantize(quantize(w))| that the stored format guarantees.

    INT: half a quantization step (scale / 2) plus the fp16 rounding of the bias and scale (relative
    2^-11 each, and an absolute floor where scale falls into fp16 subnormals); FP16: half an fp16 ulp of
    the largest value in the row; FP32: 0. Valid for |w| below fp16's largest value (65504).
    """
    data_type = _check_data_type(data_type)
    weight = weight.detach().to(torch.float32)
    largest = weight.abs().amax(dim=1)
    if data_type == DataType.FP32:
        return torch.zeros_like(largest)
    if data_type == DataType.FP16:
        return largest * 2.0 ** -11 + 2.0 ** -25  # half an ulp (relative 2^-11), subnormal floor
    levels = (1 << DATA_TYPE_NUM_BITS[data_type]) - 1
    value_range = weight.amax(dim=1) - weight.amin(dim=1)
    scale = value_range / levels
    # fp16 rounding of scale (relative 2^-11, times up to `levels` codes) and of the bias (|min| 2^-11).
    fp16_slack = (value_range + weight.amin(dim=1).abs()) * 2.0 ** -10 + levels * 2.0 ** -24
    fp32_slack = largest * 2.0 ** -22
    return scale / 2 + fp16_slack + fp32_slack
