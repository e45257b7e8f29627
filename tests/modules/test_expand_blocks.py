"""expand_blocks (a VBE output_dist's flat pooled blocks, expanded into the output) against a loop."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.modules.layout import expand_blocks


def reference(flat, spans, inverse_indices, width, base):
    """Element by element: out[b, column + c] += block[inverse_indices[feature, b], c] for every block."""
    full_batch = inverse_indices.shape[1] if inverse_indices is not None else max(rows for _, _, rows, _ in spans)
    out = base.clone() if base is not None else torch.zeros(full_batch, width, dtype=flat.dtype)
    start = 0
    for column, cols, rows, feature in spans:
        block = flat[start:start + rows * cols].view(rows, cols)
        for b in range(full_batch):
            row = int(inverse_indices[feature, b]) if inverse_indices is not None else b
            for c in range(cols):
                out[b, column + c] = out[b, column + c] + block[row, c]
        start += rows * cols
    return out


def assert_matches_reference(flat, spans, inverse, width, base, grad):
    """expand_blocks and the loop agree: values, and the gradients of flat and base."""
    mine = flat.clone().requires_grad_(True)
    my_base = base.clone().requires_grad_(True) if base is not None else None
    out = expand_blocks(mine, spans, inverse, width, my_base)
    out.backward(grad)
    theirs = flat.clone().requires_grad_(True)
    their_base = base.clone().requires_grad_(True) if base is not None else None
    expected = reference(theirs, spans, inverse, width, their_base)
    expected.backward(grad)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(mine.grad, theirs.grad)
    if base is not None:
        torch.testing.assert_close(my_base.grad, their_base.grad)


@pytest.mark.parametrize("seed", range(40))
def test_expand_blocks_matches_a_loop_values_and_gradients(seed):
    g = torch.Generator().manual_seed(seed)
    full_batch = int(torch.randint(1, 7, (1,), generator=g))
    num_features = int(torch.randint(1, 5, (1,), generator=g))
    dims = torch.randint(1, 4, (num_features,), generator=g).tolist()
    starts = [sum(dims[:f]) for f in range(num_features)]
    inverse_rows, own_rows = [], []
    for _ in range(num_features):
        if torch.rand(1, generator=g) < 0.4:  # a candidate feature: read as it is
            own_rows.append(full_batch)
            inverse_rows.append(torch.arange(full_batch))
        else:  # a user feature: a few rows, read many times
            own_rows.append(int(torch.randint(1, 4, (1,), generator=g)))
            inverse_rows.append(torch.randint(0, own_rows[-1], (full_batch,), generator=g))
    inverse = torch.stack(inverse_rows)
    spans = []
    for f in range(num_features):  # a feature's columns in one block, or cut in two; sometimes two owners' partial sums
        cuts = [0, dims[f]] if dims[f] == 1 or torch.rand(1, generator=g) < 0.5 else [0, 1, dims[f]]
        for c0, c1 in zip(cuts, cuts[1:]):
            for _ in range(1 + int(torch.rand(1, generator=g) < 0.3)):
                spans.append((starts[f] + c0, c1 - c0, own_rows[f], f))
    order = torch.randperm(len(spans), generator=g).tolist()
    spans = [spans[k] for k in order]
    width = sum(dims)
    flat = torch.randn(sum(cols * rows for _, cols, rows, _ in spans), generator=g, dtype=torch.float64)
    base = torch.randn(full_batch, width, generator=g, dtype=torch.float64) if seed % 3 == 0 else None
    grad = torch.randn(full_batch, width, generator=g, dtype=torch.float64)

    assert_matches_reference(flat, spans, inverse, width, base, grad)


def test_expand_blocks_without_inverse_indices_places_blocks_as_they_are():
    flat = torch.arange(8.)  # feature 0: 2 rows x 2 cols at column 2; feature 1: 2 rows x 2 cols at column 0
    out = expand_blocks(flat, [(2, 2, 2, 0), (0, 2, 2, 1)], None, 4)
    assert out.tolist() == [[4.0, 5.0, 0.0, 1.0], [6.0, 7.0, 2.0, 3.0]]


def test_expand_blocks_refuses_spans_that_do_not_cover_the_buffer():
    with pytest.raises(ValueError, match="the spans cover 4 values but flat has 5"):
        expand_blocks(torch.zeros(5), [(0, 2, 2, 0)], None, 2)


@pytest.mark.parametrize("layout", ["table_wise", "row_wise", "mixed_dims"])
@pytest.mark.parametrize("with_base", [False, True])
def test_expand_blocks_moves_runs_of_blocks_as_one(layout, with_base):
    """The sharded layouts: each source's features back to back in flat, alternating with another source's in
    the output (table-wise: column step 2 x dim), or every feature summed over two sources (row-wise); user
    features (2 rows) and candidate features (full batch). Runs of several blocks form, and values and
    gradients equal the loop's; runs break where dims change (mixed_dims)."""
    from rectoolkit.modules.layout import _block_runs

    g = torch.Generator().manual_seed(7)
    full_batch, dim, features = 5, 3, 8
    dims = [dim] * features if layout != "mixed_dims" else [dim, dim, 2, 2, dim, dim, 2, 2]
    columns = [sum(dims[:f]) for f in range(features)]
    user = [f < features // 2 for f in range(features)]
    rows = [2 if u else full_batch for u in user]
    inverse = torch.stack([torch.tensor([0, 1, 1, 0, 1]) if u else torch.arange(full_batch) for u in user])
    if layout in ("row_wise", "mixed_dims"):
        spans = [(columns[f], dims[f], rows[f], f) for _ in range(2) for f in range(features)]
    else:
        spans = [(columns[f], dims[f], rows[f], f) for source in range(2) for f in range(source, features, 2)]
    width = sum(dims)
    flat = torch.randn(sum(c * r for _, c, r, _ in spans), generator=g, dtype=torch.float64)
    base = torch.randn(full_batch, width, generator=g, dtype=torch.float64) if with_base else None
    grad = torch.randn(full_batch, width, generator=g, dtype=torch.float64)

    assert_matches_reference(flat, spans, inverse, width, base, grad)
    starts, start = {}, 0
    for span in spans:
        starts.setdefault(span, []).append(start)
        start += span[1] * span[2]
    targets = sorted(((c, n, r, s, "user" if user[f] else None) for (c, n, r, f), s in starts.items()),
                     key=lambda t: t[3])
    assert max(m for _, _, _, m, _, _, _ in _block_runs(targets)) >= 2  # the runs path is exercised
