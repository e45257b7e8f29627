"""to_ragged / from_ragged (rectoolkit.distributed.comm): the blocks of different widths that the output all-to-alls
send (ranks with different batch sizes, features with their own batch size), against a reference loop, values and
gradients."""

from __future__ import annotations

import torch

from rectoolkit.distributed.comm import from_ragged, to_ragged


def reference_flat(matrix, rows, widths):
    starts = [sum(rows[:k]) for k in range(len(rows))]
    return torch.cat([matrix[s:s + r, :w].reshape(-1) for s, r, w in zip(starts, rows, widths)])


def test_round_trip_values_and_gradients_against_a_loop():
    for trial in range(150):
        g = torch.Generator().manual_seed(trial)
        blocks, B = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(0, 5, (1,), generator=g))
        rows = torch.randint(0, 3, (blocks,), generator=g).tolist()
        widths = torch.randint(0, B + 1, (blocks,), generator=g).tolist()
        if trial % 5 == 0 and blocks > 1:
            widths[1] = widths[0]  # neighbours of one width (merged into one copy)
        matrix = torch.randn(sum(rows), B, generator=g, requires_grad=True)
        flat = to_ragged(matrix, rows, widths)
        expected = reference_flat(matrix.detach(), rows, widths)
        assert torch.equal(flat, expected), trial
        grad_flat = torch.randn(flat.shape, generator=g)
        flat.backward(grad_flat)
        expected_grad = torch.zeros(sum(rows), B)
        start = 0
        for k, (r, w) in enumerate(zip(rows, widths)):  # the gradient lands on the kept columns only
            expected_grad[sum(rows[:k]):sum(rows[:k]) + r, :w] = grad_flat[start:start + r * w].view(r, w)
            start += r * w
        assert torch.equal(matrix.grad, expected_grad), trial

        sent = expected.clone().requires_grad_()
        back = from_ragged(sent, rows, widths, B)
        kept = torch.arange(B) < torch.tensor([w for r, w in zip(rows, widths) for _ in range(r)]).view(-1, 1)
        assert torch.equal(back, torch.where(kept, matrix.detach(), torch.zeros(()))), trial
        grad_back = torch.randn(back.shape, generator=g)
        back.backward(grad_back)
        assert torch.equal(sent.grad, reference_flat(grad_back, rows, widths)), trial
        assert back.requires_grad  # also when nothing is sent: the backward all-to-all must still run


def test_equal_widths_are_a_reshape():
    matrix = torch.arange(6.0).view(2, 3)
    assert to_ragged(matrix, [1, 1], [3, 3]).data_ptr() == matrix.data_ptr()
    assert from_ragged(torch.arange(6.0), [2], [3], 3).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
