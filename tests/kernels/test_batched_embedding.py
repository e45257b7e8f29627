"""The batched kernel against per-bag reference loops, on both backends."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.kernels import (
    FusedOptimizerConfig,
    TableSpec,
    choose_backend,
    fbgemm_available,
    make_batched_embedding,
    optimizer_state_bytes,
)
from kernel_reference import BACKENDS, ReferenceOptimizer, random_batch, reference_pooled, reference_row_grads

TABLES = [TableSpec(12, 4, "t0"), TableSpec(7, 8, "t1"), TableSpec(30, 4, "t2")]
FEATURE_TABLE_MAP = [0, 1, 1, 2]  # t1 feeds two features; dims 4 and 8 interleave


def _init(kernel, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in kernel.table_weights:
            w.copy_(torch.rand(w.shape, generator=g) - 0.5)
    return [w.detach().clone() for w in kernel.table_weights]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_equals_reference_loop(backend, weighted):
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig("sgd", lr=0.0), backend=backend)
    assert kernel.backend == backend
    weights = _init(kernel)
    g = torch.Generator().manual_seed(1)
    indices, offsets, psw = random_batch([t.num_embeddings for t in TABLES], FEATURE_TABLE_MAP, 5, 4, g, weighted)
    out = kernel(indices, offsets, psw)
    expected = reference_pooled(weights, FEATURE_TABLE_MAP, indices, offsets, psw)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "row_wise_adagrad", "adam"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_optimizer_matches_reference_after_steps(optimizer, backend):
    """Five steps on random batches (duplicates, empty bags, weights); tolerance rtol=1e-4, atol=1e-5 (fp32 vs fp64)."""
    config = FusedOptimizerConfig(optimizer, lr=0.05, eps=1e-3, weight_decay=0.01 if optimizer == "adam" else 0.0)
    if backend == "fbgemm" and optimizer == "adam":  # fbgemm's CPU kernels have no Adam: asking for it is an error
        with pytest.raises(ValueError, match="no fused Adam.*backend='torch'"):
            make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=config, backend=backend)
        assert make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=config, backend="auto").backend == "torch"
        return
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=config, backend=backend)
    reference = ReferenceOptimizer(optimizer, _init(kernel), lr=0.05, eps=1e-3, weight_decay=config.weight_decay)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):
        indices, offsets, psw = random_batch([t.num_embeddings for t in TABLES], FEATURE_TABLE_MAP, 4, 3, g, weighted=True)
        before = [w.detach().clone() for w in kernel.table_weights]
        out = kernel(indices, offsets, psw)
        grad_out = torch.randn(out.shape, generator=g)
        (out * grad_out).sum().backward()
        reference.apply(reference_row_grads(before, FEATURE_TABLE_MAP, indices, offsets, grad_out, psw))
    for t, w in enumerate(kernel.table_weights):
        assert w.grad is None  # fused: no dense gradient
        torch.testing.assert_close(w.detach().double(), reference.weights[t], rtol=1e-4, atol=1e-5)


def test_dense_mode_gives_grads_of_per_table_embedding_bags():
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=None, backend="auto")
    weights = _init(kernel)
    g = torch.Generator().manual_seed(3)
    indices, offsets, psw = random_batch([t.num_embeddings for t in TABLES], FEATURE_TABLE_MAP, 4, 3, g, weighted=True)
    psw.requires_grad_(True)
    out = kernel(indices, offsets, psw)
    grad_out = torch.randn(out.shape, generator=g)
    (out * grad_out).sum().backward()
    # Independent: the same lookups with one nn.functional.embedding_bag per feature, autograd for the grads.
    ref_weights = [w.clone().requires_grad_(True) for w in weights]
    ref_psw = psw.detach().clone().requires_grad_(True)
    B = 4
    cols = []
    for f, t in enumerate(FEATURE_TABLE_MAP):
        lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
        cols.append(torch.nn.functional.embedding_bag(
            indices[lo:hi], ref_weights[t], offsets[f * B:(f + 1) * B + 1] - lo, mode="sum",
            per_sample_weights=ref_psw[lo:hi], include_last_offset=True))
    (torch.cat(cols, 1) * grad_out).sum().backward()
    for w, ref in zip(kernel.table_weights, ref_weights):
        torch.testing.assert_close(w.grad, ref.grad)
    torch.testing.assert_close(psw.grad, ref_psw.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_id_names_feature_table_and_id(backend):
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig("sgd"), backend=backend,
                                    feature_names=["a", "b", "c", "d"])
    offsets = torch.tensor([0, 1, 2, 3, 4])  # B = 1
    with pytest.raises(ValueError, match=r"id 7 of feature 'c' .*table 't1'.*num_embeddings=7"):
        kernel(torch.tensor([0, 1, 7, 2]), offsets)
    with pytest.raises(ValueError, match=r"id -1 of feature 'a'"):
        kernel(torch.tensor([-1, 1, 2, 2]), offsets)


def test_hash_mode_maps_ids_with_modulo():
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig("sgd", lr=0.0),
                                    ids_out_of_range="hash")
    weights = _init(kernel)
    ids = torch.tensor([12 + 5, -1, 7 * 3 + 2, 30 + 29])
    offsets = torch.tensor([0, 1, 2, 3, 4])
    expected = torch.cat([weights[0][5], weights[1][6], weights[1][2], weights[2][29]]).unsqueeze(0)
    torch.testing.assert_close(kernel(ids, offsets), expected)


def test_sequence_lookup_one_row_per_id():
    tables = [TableSpec(5, 3), TableSpec(6, 3)]
    kernel = make_batched_embedding(tables, [0, 1], pooling="none", optimizer=None)
    weights = _init(kernel)
    out = kernel(torch.tensor([4, 4, 0, 5]), torch.tensor([0, 2, 2, 3, 4]))
    torch.testing.assert_close(out, torch.stack([weights[0][4], weights[0][4], weights[1][0], weights[1][5]]))


def test_table_weights_view_the_storage_both_ways():
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig("sgd", lr=0.0))
    with torch.no_grad():
        kernel.table_weights[1][3] = 2.0
    out = kernel(torch.tensor([0, 3, 0, 0]), torch.tensor([0, 1, 2, 3, 4]))
    assert torch.all(out[0, 4:12] == 2.0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "row_wise_adagrad"])
def test_state_size_matches_planner_formula(backend, optimizer):
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig(optimizer), backend=backend)
    for spec, state in zip(TABLES, kernel.split_optimizer_states()):
        actual = sum(t.numel() * t.element_size() for t in state.values())
        assert actual == optimizer_state_bytes(optimizer, spec.num_embeddings, spec.embedding_dim)


def test_backend_choice_respects_env(monkeypatch):
    monkeypatch.setenv("RECTOOLKIT_DISABLE_FBGEMM", "1")
    sgd = FusedOptimizerConfig("sgd")
    assert choose_backend("auto", sgd, torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="fbgemm"):
        choose_backend("fbgemm", sgd, torch.device("cpu"))
    assert choose_backend("auto", None, torch.device("cpu")) == "torch"
    monkeypatch.delenv("RECTOOLKIT_DISABLE_FBGEMM")
    cpu = torch.device("cpu")
    assert choose_backend("auto", sgd, cpu, tables=[TableSpec(3, 4), TableSpec(3, 6)]) == "torch"  # fbgemm: dims % 4
    two = [TableSpec(3, 4), TableSpec(3, 4)]
    any_order = "fbgemm" if fbgemm_available() else "torch"  # fbgemm's kernel regroups a table's features itself
    assert choose_backend("auto", sgd, cpu, tables=two, feature_table_map=[0, 1, 0]) == any_order
    assert choose_backend("auto", sgd, cpu, tables=two, feature_table_map=[0, 0]) == "torch"  # table 1 unread
    assert choose_backend("auto", FusedOptimizerConfig("adam"), torch.device("cpu")) == "torch"  # no CPU Adam


def test_meta_kernel_allocates_nothing():
    kernel = make_batched_embedding([TableSpec(10**9, 128)], optimizer=FusedOptimizerConfig("adam"), device="meta")
    assert kernel.table_weights[0].is_meta and kernel.table_weights[0].shape == (10**9, 128)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_bags_empty(backend):
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig("adagrad", lr=0.1), backend=backend)
    before = [w.detach().clone() for w in kernel.table_weights]
    out = kernel(torch.empty(0, dtype=torch.int64), torch.zeros(4 * 3 + 1, dtype=torch.int64))
    assert out.shape == (3, 4 + 8 + 8 + 4) and not out.any()
    out.sum().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, kernel.table_weights))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad_id,position", [(7, 40_000), (-3, 16_384), (30, 79_999)])
def test_out_of_range_id_found_in_large_batches(backend, bad_id, position):
    """Large batches take the chunked per-feature min/max check; a bad id anywhere in a chunk is reported."""
    kernel = make_batched_embedding(TABLES, FEATURE_TABLE_MAP, optimizer=FusedOptimizerConfig("sgd"), backend=backend,
                                    feature_names=["a", "b", "c", "d"])
    per_feature = 20_000  # B = 1: the ids of feature 'c' (table t1, 7 rows) are positions 40000..59999
    ids = torch.zeros(4 * per_feature, dtype=torch.int64)
    ids[position] = bad_id
    offsets = torch.arange(0, 4 * per_feature + 1, per_feature)
    feature = "abcd"[position // per_feature]
    with pytest.raises(ValueError, match=rf"id {bad_id} of feature '{feature}'"):
        kernel(ids, offsets)
    ids[position] = 0
    assert kernel(ids, offsets).shape == (1, 24)
