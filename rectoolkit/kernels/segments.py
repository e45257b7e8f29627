"""Segments of a flat buffer: bags padded to a common batch size, and segments taken in another order.

A batched lookup's inputs and outputs are flat buffers of per-feature segments (a feature's ids, its bags, its
pooled rows). A variable batch per feature (VBE) pads each feature's bags to the largest batch (``pad_bags``), and a
kernel that groups features in its own order takes the segments in that order and back (``segment_positions``
gives the positions to index with; ``take_segments`` copies whole blocks, forward and backward). Used by the
fbgemm kernel and the sharded feature lookups.

    >>> take_segments(torch.tensor([10, 11, 20, 30]), [2, 1, 1], [1, 2, 0]).tolist()
    [20, 30, 10, 11]
"""

from __future__ import annotations

from typing import List, Sequence

import torch


def pad_bags(lengths: torch.Tensor, bags: Sequence[int], B: int) -> torch.Tensor:
    """[len(bags), B] lengths: row k holds the next bags[k] lengths, then zeros (empty bags).

    >>> pad_bags(torch.tensor([3, 1, 2]), [1, 2], 3).tolist()
    [[3, 0, 0], [1, 2, 0]]
    """
    if all(n == B for n in bags):
        return lengths.view(len(bags), B)
    counts = torch.tensor(list(bags), device=lengths.device)
    filled = torch.arange(B, device=lengths.device) < counts.unsqueeze(1)
    return lengths.new_zeros(len(bags), B).masked_scatter(filled, lengths)


def segment_positions(sizes: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Positions that take the segments of a flat buffer (segment k: sizes[k] entries) in `order`.

    >>> segment_positions(torch.tensor([2, 1, 3]), torch.tensor([2, 0, 1])).tolist()
    [3, 4, 5, 0, 1, 2]
    """
    sizes = sizes.to(torch.int64)
    starts = torch.zeros_like(sizes)
    torch.cumsum(sizes[:-1], 0, out=starts[1:])
    picked = sizes[order]
    total = int(picked.sum())
    new_starts = torch.zeros_like(picked)
    torch.cumsum(picked[:-1], 0, out=new_starts[1:])
    shift = (starts[order] - new_starts).repeat_interleave(picked, output_size=total)
    return torch.arange(total, device=sizes.device) + shift


def take_segments(flat: torch.Tensor, sizes: Sequence[int], order: Sequence[int]) -> torch.Tensor:
    """The segments of a flat buffer (segment k: the sizes[k] entries after segment k - 1) in `order`, a
    permutation: the same as flat.index_select(0, segment_positions(sizes, order)), as block copies with no index
    per entry, forward and backward (the gradient's segments go back in the inverse order).

    >>> take_segments(torch.tensor([10, 11, 20, 30, 31, 32]), [2, 1, 3], [2, 0, 1]).tolist()
    [30, 31, 32, 10, 11, 20]
    """
    sizes, order = [int(n) for n in sizes], [int(k) for k in order]
    if sorted(order) != list(range(len(sizes))) or sum(sizes) != flat.shape[0]:
        raise ValueError(f"take_segments: order {order} must be a permutation of the {len(sizes)} segments, and "
                         f"their sizes (sum {sum(sizes)}) must cover the buffer's {flat.shape[0]} entries")
    return _TakeSegments.apply(flat, sizes, order)


def _cat_segments(flat: torch.Tensor, sizes: List[int], order: List[int]) -> torch.Tensor:
    starts = [0]
    for n in sizes:
        starts.append(starts[-1] + n)
    return torch.cat([flat[starts[k]:starts[k + 1]] for k in order]) if order else flat[:0].clone()


class _TakeSegments(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat, sizes, order):
        ctx.sizes, ctx.order = sizes, order
        return _cat_segments(flat, sizes, order)

    @staticmethod
    def backward(ctx, grad):
        inverse = [0] * len(ctx.order)
        for j, k in enumerate(ctx.order):
            inverse[k] = j
        return _cat_segments(grad.contiguous(), [ctx.sizes[k] for k in ctx.order], inverse), None, None
