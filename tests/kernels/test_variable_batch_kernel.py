"""The kernels' variable-batch mode (VBE: a batch size per feature, flat output) against a reference loop."""

from __future__ import annotations

from typing import Dict, List

import pytest
import torch

from kernel_reference import BACKENDS, ReferenceOptimizer
from rectoolkit.kernels import FusedOptimizerConfig, TableSpec, make_batched_embedding


def vbe_batch(table_rows, feature_table_map, bags: List[int], generator: torch.Generator, weighted: bool):
    """(indices, offsets, weights): feature f has bags[f] bags of 0..3 ids, duplicates likely."""
    lengths = torch.randint(0, 4, (sum(bags),), generator=generator)
    ids, start = [], 0
    for f, t in enumerate(feature_table_map):
        n = int(lengths[start:start + bags[f]].sum())
        start += bags[f]
        ids.append(torch.randint(0, min(table_rows[t], 5), (n,), generator=generator) * max(1, table_rows[t] // 5))
    indices = torch.cat(ids)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return indices, offsets, torch.rand(indices.numel(), generator=generator) if weighted else None


def reference(weights, feature_table_map, bags, indices, offsets, psw, grad_flat):
    """(flat output, per-table {row: gradient}, per-id weight gradient), bag by bag."""
    out, row_grads, psw_grad = [], [dict() for _ in weights], torch.zeros(indices.numel(), dtype=torch.float64)
    bag, flat = 0, 0
    for f, t in enumerate(feature_table_map):
        dim = weights[t].shape[1]
        for _ in range(bags[f]):
            pooled = torch.zeros(dim, dtype=torch.float64)
            grad = grad_flat[flat:flat + dim].double()
            for j in range(int(offsets[bag]), int(offsets[bag + 1])):
                w = 1.0 if psw is None else float(psw[j])
                row = int(indices[j])
                pooled += w * weights[t][row].double()
                row_grads[t][row] = row_grads[t].get(row, torch.zeros(dim, dtype=torch.float64)) + w * grad
                psw_grad[j] = float((grad * weights[t][row].double()).sum())
            out.append(pooled)
            bag, flat = bag + 1, flat + dim
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64), row_grads, psw_grad


CASES = [  # (tables as (rows, dim), feature_table_map, bags per feature)
    ([(20, 4), (12, 8)], [0, 1, 1], [1, 5, 2]),
    ([(20, 8), (12, 8), (9, 4)], [1, 0, 2, 1, 0], [3, 0, 6, 1, 2]),  # a table's features apart (fbgemm permutes)
    ([(30, 4)], [0, 0], [4, 1]),
]


# the fbgemm kernel's three ways on CPU: the torch VBE lookup on its storage (default), fbgemm's VBE TBE, padding
FBGEMM_WAYS = [pytest.param(("fbgemm", way), marks=BACKENDS[1].marks, id=f"fbgemm-{way}") for way in ("torch", "fbgemm", "pad")]


@pytest.mark.parametrize("backend", [pytest.param(("torch", None), id="torch")] + FBGEMM_WAYS)
@pytest.mark.parametrize("optimizer", ["sgd", "row_wise_adagrad", "adagrad"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_vbe_lookup_and_fused_update_match_a_loop(backend, optimizer, case):
    shapes, feature_table_map, bags = CASES[case]
    tables = [TableSpec(rows, dim) for rows, dim in shapes]
    kernel = make_batched_embedding(tables, feature_table_map, optimizer=FusedOptimizerConfig(optimizer, lr=0.1),
                                    backend=backend[0])
    if backend[1] is not None:
        kernel.cpu_variable_batch = backend[1]
    generator = torch.Generator().manual_seed(case)
    with torch.no_grad():
        for w in kernel.table_weights:
            w.copy_(torch.rand(w.shape, generator=generator))
    ref_opt = ReferenceOptimizer(optimizer, [w.detach() for w in kernel.table_weights], lr=0.1)
    for step in range(3):  # two VBE steps, then a plain one: it continues from the state the VBE steps left
        step_bags = bags if step < 2 else [3] * len(bags)
        indices, offsets, psw = vbe_batch([r for r, _ in shapes], feature_table_map, step_bags, generator,
                                          weighted=step == 1)
        if step < 2:
            out = kernel(indices, offsets, psw, batch_size_per_feature=bags)
        else:  # [B, dims] -> the flat per-feature layout of the reference
            columns = kernel(indices, offsets, psw).split([shapes[t][1] for t in feature_table_map], dim=1)
            out = torch.cat([c.reshape(-1) for c in columns])
        grad = torch.randn(out.shape, generator=generator)
        expected, row_grads, _ = reference(ref_opt.weights, feature_table_map, step_bags, indices, offsets, psw, grad)
        assert out.shape == (sum(b * shapes[t][1] for b, t in zip(step_bags, feature_table_map)),)
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
        out.backward(grad)
        ref_opt.apply(row_grads)
        for w, ref_w in zip(kernel.table_weights, ref_opt.weights):
            torch.testing.assert_close(w.detach().double(), ref_w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vbe_per_sample_weight_gradient(backend):
    shapes, feature_table_map, bags = CASES[1]
    kernel = make_batched_embedding([TableSpec(r, d) for r, d in shapes], feature_table_map,
                                    optimizer=FusedOptimizerConfig("sgd", lr=0.0), backend=backend)
    generator = torch.Generator().manual_seed(7)
    indices, offsets, psw = vbe_batch([r for r, _ in shapes], feature_table_map, bags, generator, weighted=True)
    psw.requires_grad_(True)
    out = kernel(indices, offsets, psw, batch_size_per_feature=bags)
    grad = torch.randn(out.shape, generator=generator)
    out.backward(grad)
    weights = [w.detach() for w in kernel.table_weights]
    _, _, psw_grad = reference(weights, feature_table_map, bags, indices, offsets, psw.detach(), grad)
    torch.testing.assert_close(psw.grad.double(), psw_grad, atol=1e-5, rtol=1e-5)


def test_vbe_dense_gradients_without_fused_optimizer():
    shapes, feature_table_map, bags = CASES[0]
    kernel = make_batched_embedding([TableSpec(r, d) for r, d in shapes], feature_table_map, backend="torch")
    generator = torch.Generator().manual_seed(3)
    indices, offsets, _ = vbe_batch([r for r, _ in shapes], feature_table_map, bags, generator, weighted=False)
    out = kernel(indices, offsets, batch_size_per_feature=bags)
    grad = torch.randn(out.shape, generator=generator)
    out.backward(grad)
    _, row_grads, _ = reference([w.detach() for w in kernel.table_weights], feature_table_map, bags, indices, offsets,
                                None, grad)
    for t, w in enumerate(kernel.table_weights):
        dense = torch.zeros(w.shape, dtype=torch.float64)
        for row, g in row_grads[t].items():
            dense[row] = g
        torch.testing.assert_close(w.grad.double(), dense, atol=1e-5, rtol=1e-5)


def test_vbe_refuses_inconsistent_batch_sizes():
    kernel = make_batched_embedding([TableSpec(10, 4)], [0, 0], backend="torch")
    ids, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2, 3])  # 3 bags
    with pytest.raises(ValueError, match=r"has 2 bags; offsets needs sum\(batch_size_per_feature\) \+ 1"):
        kernel(ids, offsets, batch_size_per_feature=[1, 1])
    with pytest.raises(ValueError, match="must give 2 batch sizes >= 0, one per feature"):
        kernel(ids, offsets, batch_size_per_feature=[3])
    sequence: Dict = dict(pooling="none")
    with pytest.raises(ValueError, match="needs pooling 'sum'"):
        make_batched_embedding([TableSpec(10, 4)], [0, 0], backend="torch", **sequence)(
            ids, offsets, batch_size_per_feature=[1, 2])
