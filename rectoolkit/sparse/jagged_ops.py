"""Small tensor routines shared by the jagged types: lengths <-> offsets, padding, printing.

Each routine uses an fbgemm op only where it is measurably faster on the device at hand and
``rectoolkit.fbgemm_probe.fbgemm_available()`` is True; the pure-torch path gives identical results.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from rectoolkit.fbgemm_probe import fbgemm_available as use_fbgemm  # cheap: cached per value of the variable


def _fbgemm_cumsum_is_faster(lengths: torch.Tensor) -> bool:
    # Measured on CPU (1 thread, 26 x 8192): fbgemm's complete_cumsum is ~2x faster than torch's
    # for int32 and ~2x slower for int64. On GPUs it is the standard path.
    return (lengths.dtype == torch.int32 or lengths.is_cuda) and use_fbgemm()


_complete_cumsum_op: List[object] = []  # fbgemm's op overload, looked up once (the lookup costs ~0.5 us a call)


def _fbgemm_complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    if not _complete_cumsum_op:
        _complete_cumsum_op.append(torch.ops.fbgemm.asynchronous_complete_cumsum.default)
    return _complete_cumsum_op[0](lengths)


def offsets_dtype(lengths: torch.Tensor) -> torch.dtype:
    """The lengths' dtype, widened to int32 for 8- and 16-bit lengths, whose sums would wrap around (TorchRec's
    fbgemm cumsum refuses those dtypes).

    >>> offsets_dtype(torch.tensor([200, 200], dtype=torch.uint8))
    torch.int32
    """
    return torch.int32 if lengths.dtype in (torch.int16, torch.int8, torch.uint8) else lengths.dtype


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """[2, 0, 1] -> [0, 2, 2, 3], same dtype (see offsets_dtype) and device as ``lengths``.

    >>> lengths_to_offsets(torch.tensor([2, 0, 1]))
    tensor([0, 2, 2, 3])
    """
    if _fbgemm_cumsum_is_faster(lengths):
        return _fbgemm_complete_cumsum(lengths)
    dtype = offsets_dtype(lengths)
    offsets = torch.empty(lengths.numel() + 1, dtype=dtype, device=lengths.device)
    offsets[0] = 0
    torch.cumsum(lengths, 0, dtype=dtype, out=offsets[1:])
    return offsets


def batched_lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Row-wise offsets of a [F, B] lengths tensor: [F, B + 1], each row starting at 0.

    >>> batched_lengths_to_offsets(torch.tensor([[1, 2], [3, 4]]))
    tensor([[0, 1, 3],
            [0, 3, 7]])
    """
    num_rows, batch = lengths.shape
    if batch > 0 and num_rows > 0 and _fbgemm_cumsum_is_faster(lengths):
        # One flat cumsum, then rebase each row on its first offset: row f of the (overlapping)
        # [F, B + 1] view is flat[f * B : (f + 1) * B + 1].
        flat = lengths_to_offsets(lengths.reshape(-1))
        return flat.as_strided((num_rows, batch + 1), (batch, 1)) - flat[0 : num_rows * batch : batch].unsqueeze(1)
    dtype = offsets_dtype(lengths)
    offsets = torch.empty(num_rows, batch + 1, dtype=dtype, device=lengths.device)
    offsets[:, 0] = 0
    torch.cumsum(lengths, 1, dtype=dtype, out=offsets[:, 1:])
    return offsets


def min_and_sum_per_row(lengths_2d: torch.Tensor, sum_dtype: torch.dtype) -> List[int]:
    """[row sums..., m], where m < 0 exactly when some length is negative.

    m is the overall min where that is cheap, otherwise a stand-in with the same sign. The reductions are
    picked by measured speed per dtype (CPU, 26 x 8192): torch.amin is fast for int32 (12 us) but very slow
    for int64 (650 us), where even aminmax takes 50-60 us. For contiguous int64 lengths, the min of the
    int32 halves (25 us) is >= 0 exactly when every high half and every low half is >= 0, which implies that
    every length is >= 0; only when it is negative is the exact min computed.
    """
    sums = lengths_2d.sum(1, dtype=sum_dtype)
    if lengths_2d.dtype == torch.int64 and lengths_2d.is_contiguous() and lengths_2d.device.type == "cpu":
        halves_smallest = int(torch.amin(lengths_2d.view(torch.int32)))
        if halves_smallest >= 0:
            return sums.tolist() + [halves_smallest]
        return sums.tolist() + [int(torch.aminmax(lengths_2d)[0])]  # a low half >= 2**31 also lands here
    # Two small read-backs: cheaper than a torch.cat to read back once (~15 us of dispatch).
    smallest = torch.amin(lengths_2d) if lengths_2d.dtype == torch.int32 else torch.aminmax(lengths_2d)[0]
    return sums.tolist() + [int(smallest)]


def offsets_to_lengths(offsets: torch.Tensor) -> torch.Tensor:
    """[0, 2, 2, 3] -> [2, 0, 1]."""
    return torch.diff(offsets)


def cumsum_list(lengths: List[int]) -> List[int]:
    """Python-list offsets: [2, 0, 1] -> [0, 2, 2, 3]."""
    out = [0] * (len(lengths) + 1)
    running = 0
    for i, length in enumerate(lengths):
        running += length
        out[i + 1] = running
    return out


def jagged_to_padded_dense(
    values: torch.Tensor,
    offsets: torch.Tensor,
    lengths: torch.Tensor,
    max_length: int,
    padding_value: float,
) -> torch.Tensor:
    """A [B, max_length, *values.shape[1:]] tensor: row i holds the first max_length values of sample i.

    >>> jagged_to_padded_dense(torch.tensor([1., 2., 3.]), torch.tensor([0, 2, 2, 3]),
    ...                        torch.tensor([2, 0, 1]), 2, -1.0)
    tensor([[ 1.,  2.],
            [-1., -1.],
            [ 3., -1.]])
    """
    batch = lengths.numel()
    if use_fbgemm() and values.dim() <= 2:
        # One fused pass over the output, no mask or gather index.
        return torch.ops.fbgemm.jagged_to_padded_dense(values, [offsets], [max_length], padding_value)
    fill = padding_value if values.is_floating_point() else int(padding_value)
    dense = torch.full(
        (batch, max_length) + tuple(values.shape[1:]),
        fill,
        dtype=values.dtype,
        device=values.device,
    )
    if batch == 0 or max_length == 0:
        return dense
    positions = torch.arange(max_length, device=values.device)
    mask = positions.unsqueeze(0) < lengths.unsqueeze(1)
    source = offsets[:-1].unsqueeze(1).to(torch.int64) + positions.unsqueeze(0)
    dense[mask] = values[source[mask]]
    return dense


def values_string(values: torch.Tensor, start: int, end: int) -> str:
    """'[1, 2]' for a 1-D slice, '[[1, 2], [3, 4]]' for a 2-D one (TorchRec's layout)."""
    if values.dim() == 1:
        return "[" + ", ".join(str(v) for v in values[start:end].tolist()) + "]"
    if values.dim() == 2:
        rows = values[start:end].tolist()
        return "[" + ", ".join("[" + ", ".join(str(v) for v in row) + "]" for row in rows) + "]"
    raise ValueError("the values dimension is larger than 2, we don't support printing")


def jagged_values_string(values: torch.Tensor, offsets: List[int], first: int, last: int) -> str:
    """'[[1, 2], [], [3]]': samples first..last-1 of a jagged tensor, given its offsets as a list."""
    return (
        "["
        + ", ".join(values_string(values, offsets[i], offsets[i + 1]) for i in range(first, last))
        + "]"
    )


def cat_or_empty(tensors: List[torch.Tensor], like: Optional[torch.Tensor]) -> torch.Tensor:
    if tensors:
        return torch.cat(tensors)
    assert like is not None
    return like.new_empty((0,) + tuple(like.shape[1:]))
