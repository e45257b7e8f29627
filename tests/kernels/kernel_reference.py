"""Straightforward reference implementations (loops over bags and rows), independent of rectoolkit.kernels."""

from __future__ import annotations

import math
from typing import Dict, List, Sequence

import pytest
import torch

from rectoolkit.kernels import fbgemm_available

BACKENDS = [
    "torch",
    pytest.param("fbgemm", marks=[pytest.mark.fbgemm,
                                  pytest.mark.skipif(not fbgemm_available(), reason="fbgemm_gpu not available")]),
]


def random_batch(table_rows: Sequence[int], feature_table_map: Sequence[int], batch_size: int, max_len: int,
                 generator: torch.Generator, weighted: bool = False):
    """(indices, offsets, per_sample_weights) in TBE layout, with duplicates and empty bags likely."""
    lengths = torch.randint(0, max_len + 1, (len(feature_table_map) * batch_size,), generator=generator)
    ids = []
    for f, t in enumerate(feature_table_map):
        n = int(lengths[f * batch_size:(f + 1) * batch_size].sum())
        # few distinct ids, so duplicates inside a batch are common
        ids.append(torch.randint(0, min(table_rows[t], 4), (n,), generator=generator) * max(1, table_rows[t] // 4))
    indices = torch.cat(ids)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.rand(indices.numel(), generator=generator) if weighted else None
    return indices, offsets, weights


def reference_pooled(weights: List[torch.Tensor], feature_table_map, indices, offsets, per_sample_weights=None):
    """[B, sum dims] by summing rows bag by bag."""
    num_features = len(feature_table_map)
    batch_size = (offsets.numel() - 1) // num_features
    columns = []
    for f, t in enumerate(feature_table_map):
        out = torch.zeros(batch_size, weights[t].shape[1])
        for b in range(batch_size):
            for j in range(int(offsets[f * batch_size + b]), int(offsets[f * batch_size + b + 1])):
                w = 1.0 if per_sample_weights is None else float(per_sample_weights[j])
                out[b] += w * weights[t][int(indices[j])]
        columns.append(out)
    return torch.cat(columns, dim=1)


def reference_row_grads(weights, feature_table_map, indices, offsets, grad_out, per_sample_weights=None) -> List[Dict[int, torch.Tensor]]:
    """Per table: {row: summed gradient} for the rows this batch touched."""
    num_features = len(feature_table_map)
    batch_size = (offsets.numel() - 1) // num_features
    grads: List[Dict[int, torch.Tensor]] = [dict() for _ in weights]
    col = 0
    for f, t in enumerate(feature_table_map):
        dim = weights[t].shape[1]
        for b in range(batch_size):
            for j in range(int(offsets[f * batch_size + b]), int(offsets[f * batch_size + b + 1])):
                w = 1.0 if per_sample_weights is None else float(per_sample_weights[j])
                row = int(indices[j])
                grads[t][row] = grads[t].get(row, torch.zeros(dim)) + w * grad_out[b, col:col + dim]
        col += dim
    return grads


class ReferenceOptimizer:
    """fbgemm's exact optimizers written row by row (the formulas of fbgemm's documentation)."""

    def __init__(self, kind: str, weights: List[torch.Tensor], lr: float, eps: float = 1e-8,
                 beta1: float = 0.9, beta2: float = 0.999, weight_decay: float = 0.0) -> None:
        self.kind, self.lr, self.eps, self.beta1, self.beta2, self.wd = kind, lr, eps, beta1, beta2, weight_decay
        self.weights = [w.clone().double() for w in weights]
        self.m1 = [torch.zeros_like(w) for w in self.weights]
        self.m2 = [torch.zeros_like(w) for w in self.weights]
        self.row_m = [torch.zeros(w.shape[0], dtype=torch.float64) for w in self.weights]
        self.step_count = 0

    def apply(self, row_grads: List[Dict[int, torch.Tensor]]) -> None:
        self.step_count += 1
        for t, grads in enumerate(row_grads):
            for row, g in grads.items():
                g = g.double()
                w = self.weights[t][row]
                if self.kind == "sgd":
                    w -= self.lr * g
                elif self.kind == "adagrad":
                    self.m1[t][row] += g * g
                    w -= self.lr * g / (self.m1[t][row].sqrt() + self.eps)
                elif self.kind == "row_wise_adagrad":
                    self.row_m[t][row] += float((g * g).sum()) / g.numel()
                    w -= self.lr * g / (math.sqrt(self.row_m[t][row]) + self.eps)
                elif self.kind == "adam":
                    self.m1[t][row] = self.beta1 * self.m1[t][row] + (1 - self.beta1) * g
                    self.m2[t][row] = self.beta2 * self.m2[t][row] + (1 - self.beta2) * g * g
                    m_hat = self.m1[t][row] / (1 - self.beta1 ** self.step_count)
                    v_hat = self.m2[t][row] / (1 - self.beta2 ** self.step_count)
                    w -= self.lr * (m_hat / (v_hat.sqrt() + self.eps) + self.wd * w)
                else:
                    raise ValueError(self.kind)
