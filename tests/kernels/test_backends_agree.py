"""Law: for any tables, features and batch, the torch and fbgemm kernels give the same outputs and updates."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rectoolkit.kernels import FusedOptimizerConfig, TableSpec, fbgemm_available, make_batched_embedding
from kernel_reference import random_batch

pytestmark = [pytest.mark.fbgemm, pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu not available")]


def _same_random_weights(kernels, generator: torch.Generator) -> None:
    with torch.no_grad():
        for weights in zip(*(k.table_weights for k in kernels)):
            value = torch.rand(weights[0].shape, generator=generator)
            for w in weights:
                w.copy_(value)


@settings(max_examples=20, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 40), st.sampled_from([4, 8, 12])), min_size=1, max_size=4),
    feature_picks=st.lists(st.integers(0, 3), min_size=1, max_size=5),
    order=st.randoms(use_true_random=False),
    batch_size=st.integers(1, 6),
    optimizer=st.sampled_from(["sgd", "adagrad", "row_wise_adagrad"]),
    weighted=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_torch_and_fbgemm_kernels_agree(shapes, feature_picks, order, batch_size, optimizer, weighted, seed):
    tables = [TableSpec(rows, dim) for rows, dim in shapes]
    # every table read (fbgemm's condition); features in any order, a table's features often not adjacent
    feature_table_map = list(range(len(tables))) + [p % len(tables) for p in feature_picks]
    order.shuffle(feature_table_map)
    kernels = [make_batched_embedding(tables, feature_table_map, optimizer=FusedOptimizerConfig(optimizer, lr=0.1),
                                      backend=backend) for backend in ("torch", "fbgemm")]
    g = torch.Generator().manual_seed(seed)
    _same_random_weights(kernels, g)
    for _ in range(2):
        indices, offsets, psw = random_batch([t.num_embeddings for t in tables], feature_table_map, batch_size, 3, g, weighted)
        outs = [k(indices, offsets, psw) for k in kernels]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
        grad = torch.randn(outs[0].shape, generator=g)
        for out in outs:
            (out * grad).sum().backward()
    for a, b in zip(*(k.table_weights for k in kernels)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "row_wise_adagrad"])
@pytest.mark.parametrize("pooling,weighted", [("sum", False), ("sum", True), ("none", False)])
def test_non_adjacent_shared_features_agree(optimizer, pooling, weighted):
    """fbgemm's TBE alone mis-updates (or raises) when a table's features are not adjacent; the kernel must not."""
    tables = [TableSpec(9, 4, "a"), TableSpec(7, 4, "b"), TableSpec(5, 4, "c")]
    feature_table_map = [0, 1, 0, 2, 1, 0]  # a, b, a, c, b, a
    kernels = [make_batched_embedding(tables, feature_table_map, pooling=pooling, backend=backend,
                                      optimizer=FusedOptimizerConfig(optimizer, lr=0.1)) for backend in ("torch", "fbgemm")]
    assert [k.backend for k in kernels] == ["torch", "fbgemm"]
    g = torch.Generator().manual_seed(7)
    _same_random_weights(kernels, g)
    for _ in range(3):
        indices, offsets, psw = random_batch([t.num_embeddings for t in tables], feature_table_map, 4, 3, g, weighted)
        psws = [psw.clone().requires_grad_(True) if weighted else None for _ in kernels]
        outs = [k(indices, offsets, w) for k, w in zip(kernels, psws)]
        torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
        grad = torch.randn(outs[0].shape, generator=g)
        for out in outs:
            (out * grad).sum().backward()
        if weighted:
            torch.testing.assert_close(psws[0].grad, psws[1].grad, rtol=1e-5, atol=1e-6)
    for a, b in zip(*(k.table_weights for k in kernels)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(*(k.split_optimizer_states() for k in kernels)):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6)
