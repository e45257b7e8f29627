"""The traced lookup (what torch.compile / torch.export run) against the reference loops: values and gradients."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.kernels import TableSpec, make_batched_embedding
from rectoolkit.kernels.traced_lookup import traced_lookup
from kernel_reference import random_batch, reference_pooled, reference_row_grads

TABLES = [TableSpec(12, 4, "a"), TableSpec(9, 2, "b"), TableSpec(7, 4, "c")]  # two dim groups, tables interleaved
FEATURE_TABLE_MAP = [0, 1, 1, 2]


@pytest.mark.parametrize("weighted", [False, True])
def test_pooled_values_and_dense_gradients_equal_the_reference_loops(weighted):
    g = torch.Generator().manual_seed(3)
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, pooling="sum", backend="torch")
    with torch.no_grad():
        for weight in kernel.table_weights:
            weight.copy_(torch.randn(weight.shape, generator=g))
    indices, offsets, psw = random_batch([t.num_embeddings for t in TABLES], FEATURE_TABLE_MAP, batch_size=5,
                                         max_len=3, generator=g, weighted=weighted)
    pooled = traced_lookup(kernel, indices, offsets, psw)
    tables = [w.detach() for w in kernel.table_weights]
    torch.testing.assert_close(pooled, reference_pooled(tables, FEATURE_TABLE_MAP, indices, offsets, psw))

    grad_out = torch.randn(pooled.shape, generator=g)
    pooled.backward(grad_out)
    expected = reference_row_grads(tables, FEATURE_TABLE_MAP, indices, offsets, grad_out, psw)
    for t, weight in enumerate(kernel.table_weights):
        dense = torch.zeros_like(weight)
        for row, grad in expected[t].items():
            dense[row] = grad
        torch.testing.assert_close(weight.grad, dense, rtol=1e-5, atol=1e-6)


def test_sequence_lookup_returns_one_row_per_id():
    kernel = make_batched_embedding([TableSpec(5, 3), TableSpec(4, 3)], [0, 1], pooling="none", backend="torch")
    with torch.no_grad():
        for t, weight in enumerate(kernel.table_weights):
            weight.copy_(torch.arange(weight.numel(), dtype=torch.float32).view(weight.shape) + 100 * t)
    indices, offsets = torch.tensor([4, 0, 3, 1]), torch.tensor([0, 2, 2, 3, 4])  # B = 2: a: [4, 0], []; b: [3], [1]
    rows = traced_lookup(kernel, indices, offsets)
    expected = torch.stack([kernel.table_weights[0][4], kernel.table_weights[0][0],
                            kernel.table_weights[1][3], kernel.table_weights[1][1]]).detach()
    assert torch.equal(rows, expected)
