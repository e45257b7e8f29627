"""The batched lookup as plain aten ops on the table Parameters: what torch.compile and torch.export trace.

The eager kernels (batched_embedding.py) run a custom autograd function whose backward sorts the ids and
updates the touched rows in place; a compiler cannot trace that (data-dependent shapes, writes into the
storage from backward) and an exported program must hold aten ops only. While tracing, a kernel runs this
lookup instead: the same rows, the same `embedding_bag` / `embedding` calls, on the Parameters themselves,
so autograd gives the same dense gradients as the eager kernel without a fused optimizer (up to the order of
float sums) and a traced graph has no data-dependent branch:

    rows      = ids + (first row of the feature's table inside its dim group)    [a shift per id]
    weight_g  = cat(table weights of dim group g)                                [one [rows, dim] block per dim]
    pooled    = embedding_bag(rows, weight_g, offsets)                           [F * B bags, each group's dim]

With tables of several dims every group pools all F * B bags, with the ids of other groups weighted 0 (no
per-feature slicing, whose sizes would depend on the lengths). Ids are not range-checked here: the eager
call checks them (an exported program has no Python to raise).

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


class _DimGroupPlan(NamedTuple):
    dim: int
    table_ids: List[int]
    features: List[int]


class TracedPlan(NamedTuple):
    """Static layout of a kernel's tables by embedding dim (built once per kernel, no tensor data read)."""

    groups: List[_DimGroupPlan]
    row_shift: torch.Tensor  # [F]: the first row of feature f's table inside its dim group's block
    feature_in_group: List[torch.Tensor]  # per group, [F] bool


def _plan(kernel) -> TracedPlan:
    plan = getattr(kernel, "_traced_plan", None)
    if plan is not None:
        return plan
    dims = sorted({t.embedding_dim for t in kernel.tables})
    table_row_shift, table_group, tables_by_group = {}, {}, []
    for g, dim in enumerate(dims):
        tables_by_group.append([t for t, spec in enumerate(kernel.tables) if spec.embedding_dim == dim])
        cursor = 0
        for t in tables_by_group[g]:
            table_row_shift[t], table_group[t] = cursor, g
            cursor += kernel.tables[t].num_embeddings
    groups = [_DimGroupPlan(dim, tables_by_group[g],
                            [f for f, t in enumerate(kernel.feature_table_map) if table_group[t] == g])
              for g, dim in enumerate(dims)]
    device = kernel.device
    row_shift = torch.tensor([table_row_shift[t] for t in kernel.feature_table_map], dtype=torch.int64, device=device)
    in_group = [torch.tensor([table_group[t] == g for t in kernel.feature_table_map], device=device)
                for g in range(len(groups))]
    kernel._traced_plan = TracedPlan(groups, row_shift, in_group)
    return kernel._traced_plan


def _per_id(per_feature: torch.Tensor, ids_per_feature: torch.Tensor, num_ids) -> torch.Tensor:
    return per_feature.repeat_interleave(ids_per_feature, output_size=num_ids)


def traced_lookup(kernel, indices: torch.Tensor, offsets: torch.Tensor,
                  per_sample_weights: Optional[torch.Tensor] = None,
                  table_weights: Optional[Sequence[torch.Tensor]] = None) -> torch.Tensor:
    """`kernel(indices, offsets, per_sample_weights)` as aten ops on `table_weights` (see the module docstring).

    `table_weights`: one [rows, dim] tensor per table, by default `kernel.table_weights`; a module passes its own
    Parameters (under torch.export they are stand-ins for the kernel's)."""
    ids, offsets, batch_size, ids_per_feature = kernel.prepare_ids(indices, offsets)
    table_weights = kernel.table_weights if table_weights is None else list(table_weights)
    plan = _plan(kernel)
    num_ids = ids.numel()
    rows = ids + _per_id(plan.row_shift.to(ids.device), ids_per_feature, num_ids) if len(kernel.tables) > 1 else ids
    weights = [table_weights[group.table_ids[0]] if len(group.table_ids) == 1
               else torch.cat([table_weights[t] for t in group.table_ids]) for group in plan.groups]
    if not kernel.pooled:
        return F.embedding(rows, weights[0]).float()
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.to(device=ids.device, dtype=torch.float32)
    if len(plan.groups) == 1:
        pooled = F.embedding_bag(rows, weights[0], offsets, mode="sum", per_sample_weights=per_sample_weights,
                                 include_last_offset=True).float()
        # [F * B, dim] -> [B, F * dim] by a concatenation: a transposed reshape makes the tracer guard B != 1
        return torch.cat(pooled.view(kernel.num_features, batch_size, plan.groups[0].dim).unbind(0), dim=1)
    per_feature: Dict[int, torch.Tensor] = {}
    for group, weight, in_group in zip(plan.groups, weights, plan.feature_in_group):
        mine = _per_id(in_group.to(ids.device), ids_per_feature, num_ids)
        group_rows = torch.where(mine, rows, torch.zeros_like(rows))  # row 0 exists; its weight below is 0
        scale = mine.to(torch.float32 if per_sample_weights is not None else weight.dtype)
        group_weights = scale * per_sample_weights if per_sample_weights is not None else scale
        pooled = F.embedding_bag(group_rows, weight, offsets, mode="sum", per_sample_weights=group_weights,
                                 include_last_offset=True).float().view(kernel.num_features, batch_size, group.dim)
        for f in group.features:
            per_feature[f] = pooled[f]
    return torch.cat([per_feature[f] for f in range(kernel.num_features)], dim=1)
