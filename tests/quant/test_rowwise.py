"""Row-wise quantization: stored bytes (hand-worked, reference loop, fbgemm), round-trip error laws."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rectoolkit as rtk
from rectoolkit.modules.configs import DataType
from rectoolkit.quant.rowwise import (
    dequantize_rowwise,
    max_abs_error_bound,
    quantize_rowwise,
    row_size_in_bytes,
    split_scale_bias,
)

INT_TYPES = [DataType.INT8, DataType.INT4, DataType.INT2]
ALL_TYPES = INT_TYPES + [DataType.FP16, DataType.FP32]
BITS = {DataType.INT8: 8, DataType.INT4: 4, DataType.INT2: 2}
needs_fbgemm = [pytest.mark.fbgemm, pytest.mark.skipif(not rtk.fbgemm_available(), reason="fbgemm_gpu not available")]


def reference_quantize_row(row: np.ndarray, bits: int) -> bytes:
    """fbgemm's reference algorithm, one element at a time with numpy fp32/fp16 (scale, bias first; no padding)."""
    row = row.astype(np.float32)
    lo, hi = np.float32(row.min()), np.float32(row.max())
    bias16 = np.float16(lo)
    lo = np.float32(bias16)
    span = np.float32(hi - lo)
    scale = np.float32(1.0) if span == 0 else np.float32(span / np.float32((1 << bits) - 1))
    scale = np.float32(np.float16(scale))
    if scale == 0:
        scale = np.float32(1.0)
    inverse = np.float32(np.float32(1.0) / scale)
    if math.isinf(inverse):
        scale, inverse = np.float32(1.0), np.float32(1.0)
    per_byte = 8 // bits
    packed = bytearray(len(row) // per_byte)
    for col, x in enumerate(row):
        code = int(np.clip(np.rint(np.float32(np.float32(x - lo) * inverse)), 0, (1 << bits) - 1))
        packed[col // per_byte] |= code << ((col % per_byte) * bits)
    return np.float16(scale).tobytes() + bias16.tobytes() + bytes(packed)


def test_row_sizes_match_torchrec_layout():
    # TorchRec's QuantEBC state_dict for a 64-dim table (checked against torchrec 1.8): fp32 256, fp16 128,
    # int8 4 + 64 -> 80 (seed 001's 4096 x 80), int4 4 + 32 -> 48, int2 4 + 16 -> 32; a dim-8 table pads to 16.
    assert row_size_in_bytes(64, DataType.FP32) == 256
    assert row_size_in_bytes(64, DataType.FP16) == 128
    assert row_size_in_bytes(64, DataType.INT8) == 80
    assert row_size_in_bytes(64, DataType.INT4) == 48
    assert row_size_in_bytes(64, DataType.INT2) == 32
    assert row_size_in_bytes(8, DataType.INT8) == 16
    assert row_size_in_bytes(64, DataType.INT8, row_alignment=1) == 68


@pytest.mark.parametrize("backend", ["torch", pytest.param("fbgemm", marks=needs_fbgemm)])
def test_hand_worked_int8_and_int4_rows(backend):
    w = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    rows = quantize_rowwise(w, DataType.INT8, backend=backend)
    # scale (3 - 0) / 255 in fp16, bias 0.0, codes 0, 85, 170, 255, then 8 bytes of padding
    scale16 = np.float16(3.0 / 255.0).tobytes()
    assert rows[0].tolist() == list(scale16) + [0, 0] + [0, 85, 170, 255] + [0] * 8
    # INT4: [0, 15, 5, 10] -> scale 1, bias 0, codes packed low nibble first: 0 | 15 << 4 = 240, 5 | 10 << 4 = 165
    rows4 = quantize_rowwise(torch.tensor([[0.0, 15.0, 5.0, 10.0]]), DataType.INT4, backend=backend)
    assert rows4[0].tolist() == [0, 60, 0, 0, 240, 165] + [0] * 10  # fp16 1.0 == 0x3C00
    assert dequantize_rowwise(rows4, DataType.INT4, 4).tolist() == [[0.0, 15.0, 5.0, 10.0]]


def test_constant_row_has_scale_one_and_exact_round_trip():
    w = torch.full((2, 8), 0.25)
    rows = quantize_rowwise(w, DataType.INT4, backend="torch")
    _, scale, bias = split_scale_bias(rows, DataType.INT4, 8)
    assert scale.tolist() == [1.0, 1.0] and bias.tolist() == [0.25, 0.25]
    assert torch.equal(dequantize_rowwise(rows, DataType.INT4, 8), w)


@pytest.mark.parametrize("data_type", INT_TYPES)
def test_torch_bytes_equal_reference_loop(data_type):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 16, generator=g) * torch.tensor([1e-3, 0.1, 1.0, 10.0, 100.0, 1e-9])[:, None]
    rows = quantize_rowwise(w, data_type, backend="torch")
    for r in range(w.shape[0]):
        expected = reference_quantize_row(w[r].numpy(), BITS[data_type])
        assert bytes(rows[r, : len(expected)].tolist()) == expected, f"row {r}"
        assert rows[r, len(expected):].eq(0).all()


@pytest.mark.parametrize("data_type", [DataType.FP16, DataType.FP32])
def test_float_types_store_the_values(data_type):
    w = torch.randn(3, 8)
    rows = quantize_rowwise(w, data_type)
    torch_dtype = torch.float16 if data_type == DataType.FP16 else torch.float32
    expected = w.to(torch_dtype).to(torch.float32)
    assert torch.equal(rows[:, : 8 * (2 if data_type == DataType.FP16 else 4)].contiguous().view(torch_dtype).float(), expected)
    assert torch.equal(dequantize_rowwise(rows, data_type, 8), expected)


rows_strategy = st.integers(1, 6)
dims_strategy = st.sampled_from([4, 8, 12, 16, 32, 64])


def float_tables(draw_rows, draw_dim, scale):
    bound = float(np.float32(scale))
    return st.lists(st.floats(-bound, bound, width=32, allow_nan=False), min_size=draw_rows * draw_dim,
                    max_size=draw_rows * draw_dim)


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, dim=dims_strategy, data_type=st.sampled_from(ALL_TYPES),
       magnitude=st.sampled_from([1e-4, 0.05, 1.0, 300.0]), data=st.data())
def test_round_trip_error_is_within_half_a_step(rows, dim, data_type, magnitude, data):
    values = data.draw(float_tables(rows, dim, magnitude))
    w = torch.tensor(values, dtype=torch.float32).view(rows, dim)
    back = dequantize_rowwise(quantize_rowwise(w, data_type, backend="torch"), data_type, dim, backend="torch")
    error = (back - w).abs().amax(dim=1)
    largest = w.abs().amax(dim=1)
    if data_type == DataType.FP32:
        assert torch.equal(back, w)
        return
    if data_type == DataType.FP16:
        bound = largest * 2.0 ** -11 + 2.0 ** -25  # half an fp16 ulp
    else:
        levels = (1 << BITS[data_type]) - 1
        span = w.amax(dim=1) - w.amin(dim=1)
        # half a step, plus the fp16 rounding of scale and bias (relative 2^-11; subnormal floor), plus fp32
        bound = span / levels / 2 + (span + w.amin(dim=1).abs()) * 2.0 ** -10 + levels * 2.0 ** -24 + largest * 2.0 ** -22
    assert (error <= bound).all(), (error, bound)
    assert (error <= max_abs_error_bound(w, data_type)).all()


@pytest.mark.parametrize("data_type", INT_TYPES)
def test_int8_error_is_at_most_half_a_step_for_fp16_exact_rows(data_type):
    # rows whose min and step are exact in fp16: the error is at most scale / 2, nothing more
    g = torch.Generator().manual_seed(0)
    levels = (1 << BITS[data_type]) - 1
    codes = torch.randint(0, levels + 1, (20, 16), generator=g).float()
    codes[:, 0], codes[:, 1] = 0, levels
    noise = (torch.rand(20, 16, generator=g) - 0.5) * 0.999
    noise[:, :2] = 0
    w = (codes + noise).clamp(0, levels) * 0.125 - 2.0
    back = dequantize_rowwise(quantize_rowwise(w, data_type), data_type, 16)
    assert ((back - w).abs() <= 0.125 / 2 + 1e-6).all()


@pytest.mark.fbgemm
@pytest.mark.skipif(not rtk.fbgemm_available(), reason="fbgemm_gpu not available")
@settings(max_examples=40, deadline=None)
@given(rows=rows_strategy, dim=st.sampled_from([4, 8, 16, 24, 64, 128]), data_type=st.sampled_from(ALL_TYPES),
       magnitude=st.sampled_from([1e-3, 1.0, 100.0]), data=st.data())
def test_torch_and_fbgemm_give_the_same_bytes_and_values(rows, dim, data_type, magnitude, data):
    w = torch.tensor(data.draw(float_tables(rows, dim, magnitude)), dtype=torch.float32).view(rows, dim)
    by_torch = quantize_rowwise(w, data_type, backend="torch")
    by_fbgemm = quantize_rowwise(w, data_type, backend="fbgemm")
    assert torch.equal(by_torch, by_fbgemm)
    assert torch.equal(dequantize_rowwise(by_torch, data_type, dim, backend="torch"),
                       dequantize_rowwise(by_torch, data_type, dim, backend="fbgemm"))


def test_fp16_input_table_quantizes_like_its_fp32_values():
    w = torch.randn(4, 16).half()
    assert torch.equal(quantize_rowwise(w, DataType.INT8, backend="torch"),
                       quantize_rowwise(w.float(), DataType.INT8, backend="torch"))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="multiple of 2"):
        quantize_rowwise(torch.randn(2, 3), DataType.INT4)
    with pytest.raises(ValueError, match="supports"):
        quantize_rowwise(torch.randn(2, 4), DataType.BF16)
    with pytest.raises(ValueError, match="2-D"):
        quantize_rowwise(torch.randn(4), DataType.INT8)
    with pytest.raises(ValueError, match="need at least 68 bytes"):
        dequantize_rowwise(torch.zeros(2, 16, dtype=torch.uint8), DataType.INT8, 64)
