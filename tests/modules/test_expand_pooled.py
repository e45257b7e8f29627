"""expand_pooled (rectoolkit.modules.layout): a VBE collection's pooled rows read through the inverse indices, values
and gradients against a loop over features (rows as they are, shared rows, rows beyond a feature's own samples)."""

from __future__ import annotations

import torch

from rectoolkit.modules.layout import expand_pooled


def reference(pooled, inverse, dims):
    starts = [sum(dims[:f]) for f in range(len(dims))]
    return torch.cat([pooled[:, s:s + d][inverse[f]] for f, (s, d) in enumerate(zip(starts, dims))], 1)


def test_values_and_gradients_against_a_loop():
    for trial in range(200):
        g = torch.Generator().manual_seed(trial)
        features, padded = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        full = int(torch.randint(1, 7, (1,), generator=g))
        dims = torch.randint(1, 4, (features,), generator=g).tolist()
        pooled = torch.randn(padded, sum(dims), generator=g, dtype=torch.float64, requires_grad=True)
        inverse = torch.randint(0, padded, (features, full), generator=g)
        if trial % 3 == 0 and full <= padded:
            inverse[0] = torch.arange(full)  # a feature read as it is
        if trial % 4 == 0 and features > 1:
            inverse[1] = inverse[0]  # neighbours that read alike
        got, expected = expand_pooled(pooled, inverse, dims), reference(pooled, inverse, dims)
        assert torch.equal(got, expected), trial
        grad = torch.randn(got.shape, generator=g, dtype=torch.float64)
        ours, = torch.autograd.grad((got * grad).sum(), pooled)
        theirs, = torch.autograd.grad((expected * grad).sum(), pooled)
        assert torch.allclose(ours, theirs), trial


def test_a_ranking_batch_user_rows_shared_candidates_as_they_are():
    pooled = torch.tensor([[1.0, 10.0], [2.0, 20.0], [0.0, 30.0]])  # user (1 sample, padded), item (3 samples)
    out = expand_pooled(pooled, torch.tensor([[0, 0, 0], [0, 1, 2]]), [1, 1])
    assert out.tolist() == [[1.0, 10.0], [1.0, 20.0], [1.0, 30.0]]
