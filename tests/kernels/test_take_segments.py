"""take_segments: the segments of a flat buffer in a new order, as block copies, forward and backward."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.kernels.batched_embedding import take_segments


def _by_hand(flat, sizes, order):
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return [flat[starts[k] + i] for k in order for i in range(sizes[k])]


@pytest.mark.parametrize("sizes, order", [
    ([3, 0, 5, 2, 4], [3, 1, 4, 0, 2]),
    ([1], [0]),
    ([2, 2, 2], [0, 1, 2]),
    ([0, 0], [1, 0]),
    ([4, 1], [1, 0]),
])
def test_take_segments_forward_and_backward(sizes, order):
    g = torch.Generator().manual_seed(len(sizes))
    flat = torch.randn(sum(sizes), generator=g, requires_grad=True)
    out = take_segments(flat, sizes, order)
    assert out.tolist() == [float(v) for v in _by_hand(flat.detach(), sizes, order)]
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad)
    expected = torch.zeros(sum(sizes))
    positions = [sum(sizes[:k]) + i for k in order for i in range(sizes[k])]  # where output entry j came from
    for j, p in enumerate(positions):
        expected[p] += grad[j]
    assert torch.equal(flat.grad, expected)


def test_take_segments_refuses_a_bad_order_or_sizes():
    with pytest.raises(ValueError, match="permutation"):
        take_segments(torch.zeros(3), [1, 2], [0, 0])
    with pytest.raises(ValueError, match="cover the buffer's 4 entries"):
        take_segments(torch.zeros(4), [1, 2], [1, 0])
