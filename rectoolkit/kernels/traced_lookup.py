"""The batched lookup as plain aten ops on the table Parameters: what torch.compile and torch.export trace.

The eager kernels (batched_embedding.py) run a custom autograd function whose backward sorts the ids and
updates the touched rows in place; a compiler cannot trace that (data-dependent shapes, writes into the
storage from backward) and an exported program must hold aten ops only. While tracing, a kernel runs this
lookup instead: `embedding_bag` / `embedding` on the table Parameters themselves, so autograd gives the same
dense gradients as the eager kernel without a fused optimizer (up to the order of float sums), and a traced
graph has no data-dependent shape:

    one table:   pooled = embedding_bag(ids, weight, offsets)                    [F * B bags]
    T tables:    pooled_t = embedding_bag(ids or 0, weight_t, offsets, per-id weight 1 or 0)
                 (ids of features reading another table weigh 0), feature f's bags taken from its table's

Slicing the ids per feature would give sizes that depend on the lengths; concatenating the tables would copy
every weight at every step. The cost here is one pass over the ids per table. Ids are not range-checked: the
eager call checks them (an exported program has no Python to raise).

    >>> import torch
    >>> from rectoolkit.kernels.batched_embedding import TableSpec, make_batched_embedding
    >>> kernel = make_batched_embedding([TableSpec(10, 4), TableSpec(6, 2)], feature_table_map=[0, 1, 1])
    >>> ids, offsets = torch.tensor([1, 2, 3, 5, 0, 4]), torch.tensor([0, 2, 3, 4, 5, 5, 6])
    >>> torch.equal(traced_lookup(kernel, ids, offsets), kernel(ids, offsets))
    True
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F


class TracedPlan(NamedTuple):
    """Static layout of a kernel's features by table (no tensor data read)."""

    features_of_table: List[List[int]]
    reads_table: List[List[bool]]  # per table, [F]: does feature f read it


def _plan(kernel) -> TracedPlan:
    """Built at each traced call (a few Python lists, only while tracing), not kept on the kernel: an attribute set
    while tracing made torch.compile recompile on the second call (a guard on its absence), and a tensor kept from
    a torch.export trace is a fake one that failed the module's next export."""
    tables = range(len(kernel.tables))
    return TracedPlan([[f for f, t in enumerate(kernel.feature_table_map) if t == table] for table in tables],
                      [[t == table for t in kernel.feature_table_map] for table in tables])


def traced_lookup(kernel, indices: torch.Tensor, offsets: torch.Tensor,
                  per_sample_weights: Optional[torch.Tensor] = None,
                  table_weights: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
    """`kernel(indices, offsets, per_sample_weights)` as aten ops on `table_weights` (see the module docstring).

    `table_weights`: one [rows, dim] tensor per table, by default `kernel.table_weights`; a module passes its own
    Parameters (under torch.export they are stand-ins for the kernel's)."""
    ids, offsets, batch_size, ids_per_feature = kernel.prepare_ids(indices, offsets)
    table_weights = kernel.table_weights if table_weights is None else list(table_weights)
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.to(device=ids.device, dtype=torch.float32)
    if len(table_weights) == 1:
        return _lookup_one_table(kernel, ids, offsets, per_sample_weights, table_weights[0], batch_size)
    plan = _plan(kernel)
    per_feature: Dict[int, torch.Tensor] = {}
    rows_out = None
    for weight, features, reads in zip(table_weights, plan.features_of_table, plan.reads_table):
        mine = torch.tensor(reads, device=ids.device).repeat_interleave(ids_per_feature, output_size=ids.numel())
        rows = torch.where(mine, ids, torch.zeros_like(ids))  # row 0 exists; its weight below is 0
        if not kernel.pooled:
            looked_up = torch.where(mine[:, None], F.embedding(rows, weight).float(), 0.0)
            rows_out = looked_up if rows_out is None else rows_out + looked_up
            continue
        scale = mine.to(torch.float32 if per_sample_weights is not None else weight.dtype)
        pooled = F.embedding_bag(rows, weight, offsets, mode="sum", include_last_offset=True,
                                 per_sample_weights=scale * per_sample_weights if per_sample_weights is not None
                                 else scale).float()
        for f in features:  # rows f * B ... of [F * B, dim]; narrowed, not viewed [F, B, dim]: a view guards B != 1
            per_feature[f] = pooled.narrow(0, f * batch_size, batch_size)
    if not kernel.pooled:
        return rows_out
    return torch.cat([per_feature[f] for f in range(kernel.num_features)], dim=1)


def _lookup_one_table(kernel, ids, offsets, per_sample_weights, weight, batch_size) -> torch.Tensor:
    if not kernel.pooled:
        return F.embedding(ids, weight).float()
    pooled = F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=per_sample_weights,
                             include_last_offset=True).float()
    # [F * B, dim] -> [B, F * dim] by a concatenation: a transposed reshape makes the tracer guard B != 1
    return torch.cat(pooled.view(kernel.num_features, batch_size, weight.shape[1]).unbind(0), dim=1)
