"""Random inputs for the jagged-type tests (plain tensors, no rectoolkit code involved)."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch


def random_kjt_inputs(
    seed: int,
    num_keys: int = 4,
    stride: int = 5,
    weighted: bool = False,
    lengths_dtype: torch.dtype = torch.int64,
    max_length: int = 4,
) -> Dict[str, object]:
    """keys, values, lengths (and weights) of a random KJT, as keyword arguments."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, max_length + 1, (num_keys * stride,), generator=generator).to(lengths_dtype)
    total = int(lengths.sum())
    values = torch.randint(0, 1000, (total,), generator=generator)
    inputs: Dict[str, object] = {
        "keys": [f"f{i}" for i in range(num_keys)],
        "values": values,
        "lengths": lengths,
    }
    if weighted:
        inputs["weights"] = torch.rand(total, generator=generator)
    return inputs


def reference_offsets(lengths: List[int]) -> List[int]:
    """Offsets by a plain loop."""
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return offsets


def reference_samples(values: List, lengths: List[int]) -> List[List]:
    """Cut a flat list into samples by a plain loop."""
    samples, start = [], 0
    for length in lengths:
        samples.append(values[start : start + length])
        start += length
    return samples


def assert_same_tensor(actual: Optional[torch.Tensor], expected: Optional[torch.Tensor]) -> None:
    if expected is None:
        assert actual is None
        return
    assert actual is not None
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.equal(actual, expected), (actual, expected)


def assert_same_jt(a, b):
    assert_same_tensor(a.values(), b.values())
    assert_same_tensor(a.weights_or_none(), b.weights_or_none())
    assert_same_tensor(a.lengths(), b.lengths())
    assert_same_tensor(a.offsets(), b.offsets())
    assert str(a) == str(b)


def assert_same_kjt(a, b):
    assert a.keys() == b.keys()
    assert a.stride() == b.stride()
    assert a.stride_per_key() == b.stride_per_key()
    assert a.length_per_key() == b.length_per_key()
    assert a.offset_per_key() == b.offset_per_key()
    assert a.lengths_offset_per_key() == b.lengths_offset_per_key()
    assert a.variable_stride_per_key() == b.variable_stride_per_key()
    assert_same_tensor(a.values(), b.values())
    assert_same_tensor(a.weights_or_none(), b.weights_or_none())
    assert_same_tensor(a.lengths(), b.lengths())
    assert_same_tensor(a.offsets(), b.offsets())
    assert str(a) == str(b)
