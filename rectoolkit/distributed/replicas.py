"""Replicated tables (DATA_PARALLEL): the local lookup and the backward that keeps replicas equal.

    forward    embedding_bag (or embedding) per feature on the local replica
    backward   each table's dense gradient (one flat buffer) -> dp_allreduce -> averaged over the ranks -> .grad
               (as the DistributedDataParallel that TorchRec wraps its DATA_PARALLEL lookups in); a lookup run
               under the collection's no_sync() skips the all-reduce, as DDP's no_sync (data_parallel.py)

The gradient buffer is kept from step to step and zeroed in place when nothing holds it any more (`zero_grad` set
.grad to None); a new one is allocated only while something still does. On CPU a buffer past glibc's mmap
threshold (32 MB) is otherwise handed back to the system when freed and page-faulted in again on every step: for
215 MB of replicas, 121 ms to zero a fresh buffer against 14 ms in place.

dp_allreduce is one backend all-reduce of every table's gradient (the flat buffer), counted per table as what a
reduce-scatter then an all-gather move (rectoolkit.plan.traffic.allreduce_values_to): on 2 ranks rank i sends rank
j 4 * (chunk_j + chunk_i) bytes, on more a ring, each rank sending the next all of each table's chunks but one in
each phase.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv, all_reduce_sum, get_gradient_division
from rectoolkit.distributed.feature_shards import FeatureBatch, ShardingGroupSpec
from rectoolkit.plan.traffic import allreduce_values_to


def make_replicas(spec: ShardingGroupSpec) -> nn.ParameterDict:
    """A full copy of every table: from the initial weights, or init_fn on rank 0 broadcast to all ranks."""
    replicas = nn.ParameterDict()
    with torch.no_grad():
        for table in spec.tables:
            source = spec.initial_weights.get(table.name)
            param = nn.Parameter(torch.empty(table.num_embeddings, table.embedding_dim, dtype=spec.dtype,
                                             device=spec.env.device))
            if source is not None:
                param.copy_(source)
            else:
                table.init_fn(param)
                if spec.env.world_size > 1:  # replicas must start equal
                    dist.broadcast(param.data, group=spec.env.pg, group_src=0)  # (rank 0 of the group)
            replicas[table.name] = param
    return replicas


def all_reduce_gradients(env: ShardingEnv, flat: torch.Tensor, sizes: Sequence[int], name: str = "dp_allreduce") -> None:
    """Sum every table's gradient over env's ranks (`sizes`: values per table, in `flat`'s order), in place, counted
    under `name` (a DMPCollection's sync() sums its shards over the replica group so, as "sync_allreduce").

    One backend all-reduce of the whole buffer, as DistributedDataParallel's: on 4 gloo ranks of the 2-core machine a
    DMPCollection sync of 4 replicas (32 MB a rank) took 47-49 ms where a reduce-scatter and an all-gather per tensor
    with all-to-alls took 93-103 ms (benchmarks/results/two_dimensional.md). Its bytes are counted as the ring moves
    them (allreduce_values_to).
    """
    W, me = env.world_size, env.rank
    values_to = np.zeros(W, dtype=np.int64)
    for size in sizes:
        values_to += np.asarray(allreduce_values_to(size, W, me), dtype=np.int64)
    all_reduce_sum(env, flat, (flat.element_size() * values_to).tolist(), name)


def held_elsewhere(buffer: torch.Tensor) -> bool:
    """Whether any tensor but `buffer` itself (a view, a .grad autograd stored, a gradient handed to the caller)
    still uses its storage; True where torch cannot tell."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return True
    return use_count(buffer.untyped_storage()._cdata) > 2  # `buffer` and the storage object made to ask


class ReplicaLookup(torch.autograd.Function):
    """Forward: the local replicas' lookup, [sum of dims, B] transposed (pooled) or flat rows (sequence).
    Backward: the dense gradients, averaged over the ranks by `group.reduce` (see module docstring); whether it
    all-reduces is decided at forward, as DDP's no_sync decides it."""

    @staticmethod
    def forward(ctx, group, batch: FeatureBatch, *weights: torch.Tensor) -> torch.Tensor:
        ctx.group, ctx.batch, ctx.sync = group, batch, group.sync_gradients
        # averaged like DDP's: the collection divides its output's gradient by the world size when
        # get_gradient_division() (comm.divide_gradient); otherwise the replicas' backward divides
        ctx.divide_by = 1 if get_gradient_division() else group.env.world_size
        outputs = []
        for f, t in zip(group.features, group.feature_table):
            ids, lengths = batch.values[f], batch.lengths[f]
            if group.pooled:
                offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=ids.device)
                torch.cumsum(lengths, 0, out=offsets[1:])
                psw = batch.weights[f].to(weights[t].dtype) if group.weighted else None
                # a float16 table is looked up in its dtype and gives float32, as the batched kernels do
                outputs.append(F.embedding_bag(ids, weights[t], offsets, mode="sum", per_sample_weights=psw,
                                               include_last_offset=True).float().t())
            else:
                outputs.append(F.embedding(ids, weights[t]).float().reshape(-1))
        return torch.cat(outputs) if len(outputs) > 1 else outputs[0].contiguous()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        group, batch = ctx.group, ctx.batch
        params = list(group.weights.values())
        # float32 whatever the tables' dtype (float16 replicas too): their gradients are summed and all-reduced
        # in float32, the precision (and bytes, rectoolkit.plan.traffic) of the other types' gradients
        flat = group.gradient_buffer(sum(p.numel() for p in params), params[0].device)
        grads = [piece.view_as(p) for piece, p in zip(flat.split([p.numel() for p in params]), params)]
        column = 0  # the output's rows: feature after feature, as forward concatenated them
        for f, t in zip(group.features, group.feature_table):
            ids, lengths, dim = batch.values[f], batch.lengths[f], grads[t].shape[1]
            if group.pooled:
                bags = grad_out[column:column + dim].t().contiguous()  # contiguous rows: 4x faster to repeat
                per_id = bags.repeat_interleave(lengths, dim=0, output_size=ids.numel())
                if group.weighted:
                    per_id = per_id * batch.weights[f].unsqueeze(1)
                column += dim
            else:
                per_id = grad_out[column:column + ids.numel() * dim].view(-1, dim)
                column += ids.numel() * dim
            grads[t].index_add_(0, ids, per_id.to(flat.dtype))
        return (None, None) + tuple(group.reduce(flat, grads, ctx.divide_by, ctx.sync))
