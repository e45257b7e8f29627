"""DATA_PARALLEL: a full replica of the table on every rank.

    input_dist    nothing: each rank looks up its own samples
    lookup        the local replica pools the local batch
    output_dist   nothing
    backward      the tables' dense gradients (one flat buffer) are all-reduced (dp_allreduce: a reduce-scatter
                  then an all-gather per table; one ring all-reduce on 2 ranks, all-to-alls on more), then
                  the optimizer is applied (fused optimizer) or the summed gradient is left in .grad (dense)

Gradients are SUMMED over ranks (not averaged), so that a replica's gradient equals the unsharded table's
gradient on the global batch, as for every other sharding type.
Bytes (rectoolkit.plan.traffic): with chunk k of the N = rows * dim values, rank i sends rank j
4 * (chunk_j + chunk_i).
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from rectoolkit.distributed.bags import FeatureBatch
from rectoolkit.distributed.comm import ShardingEnv, all_reduce_sum, all_to_all
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig, apply_row_update, init_optimizer_state
from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.modules.configs import BaseEmbeddingConfig
from rectoolkit.plan.traffic import dp_chunk_sizes
from rectoolkit.plan.types import ParameterSharding, ShardingType, ShardMetadata


class DataParallelSharding(nn.Module):
    """The DATA_PARALLEL tables of one sharded collection (replicas, gradients all-reduced in backward)."""

    sharding_type = ShardingType.DATA_PARALLEL

    def __init__(self, env: ShardingEnv, tables: Sequence[BaseEmbeddingConfig], output_keys: Sequence[Sequence[str]],
                 module_plan: Mapping[str, ParameterSharding], key_offsets: Mapping[str, int], pooled: bool,
                 weighted: bool, optimizer: Optional[FusedOptimizerConfig],
                 initial_weights: Mapping[str, torch.Tensor], backend: str = "auto",
                 dtype: torch.dtype = torch.float32, embedding_dim: int = 0) -> None:
        super().__init__()
        self.env, self.tables, self.pooled, self.weighted = env, list(tables), pooled, weighted
        self.embedding_dim = embedding_dim
        self.optimizer = optimizer
        self.features = [f for t in self.tables for f in t.feature_names]
        self.feature_dims = [t.embedding_dim for t in self.tables for _ in t.feature_names]
        self.output_keys = [k for keys in output_keys for k in keys]
        self.module_plan = {t.name: module_plan[t.name] for t in self.tables}
        for table in self.tables:
            ps = module_plan[table.name]
            full = [s for s in ps.shards if s.shard_sizes == [table.num_embeddings, table.embedding_dim]]
            if ps.shards and len(full) != len(ps.shards):
                raise ValueError(f"table {table.name!r} is DATA_PARALLEL but not every shard is the full "
                                 f"{table.num_embeddings} x {table.embedding_dim} table: {ps.shards}")
        self.weights = nn.ParameterDict()
        self.feature_table = [i for i, t in enumerate(self.tables) for _ in t.feature_names]
        with torch.no_grad():
            for table in self.tables:
                source = initial_weights.get(table.name)
                param = nn.Parameter(torch.empty(table.num_embeddings, table.embedding_dim, dtype=dtype,
                                                 device=env.device))
                if source is not None:
                    param.copy_(source)
                else:
                    table.init_fn(param)
                    if env.world_size > 1:  # replicas must start equal
                        dist.broadcast(param.data, src=0, group=env.pg)
                self.weights[table.name] = param
        self.states: List[Dict[str, torch.Tensor]] = [
            init_optimizer_state(optimizer, t.num_embeddings, t.embedding_dim, env.device) if optimizer else {}
            for t in self.tables]
        self.num_updates = 0
        self.dtype = dtype
        self._backward_buffers: Optional[torch.Tensor] = None
        if optimizer is not None:
            for param in self.weights.values():
                param._in_backward_optimizers = ["fused"]
        self.register_buffer("out_columns", torch.cat(
            [torch.arange(key_offsets[k], key_offsets[k] + d) for k, d in zip(self.output_keys, self.feature_dims)]
        ).to(env.device), persistent=False)

    # -------------------------------------------------------------- the three steps
    def input_dist(self, batch: FeatureBatch) -> FeatureBatch:
        return batch  # nothing to send: each rank looks up its own samples

    def lookup(self, batch: FeatureBatch) -> torch.Tensor:
        """Pooled: [sum of dims, B] (transposed, like the other types). Sequence: flat rows of every id."""
        weights = list(self.weights.values())
        return _ReplicaLookup.apply(self, batch, *weights)

    def output_dist(self, looked_up: torch.Tensor, batch: FeatureBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.pooled:
            return looked_up, self.out_columns  # nothing to send
        D = self.embedding_dim
        device = looked_up.device
        where = [(torch.arange(batch.value_starts[f], batch.value_starts[f] + batch.values[f].numel(), device=device)
                  .unsqueeze(1) * D + torch.arange(D, device=device)).reshape(-1) for f in self.features]
        return looked_up, torch.cat(where).to(looked_up.device)

    def forward(self, batch: FeatureBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.output_dist(self.lookup(self.input_dist(batch)), batch)

    # -------------------------------------------------------------- backward: dp_allreduce
    def gradient_buffer(self) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """One zeroed flat buffer for every table's gradient, and its per-table [rows, dim] views. Kept from
        step to step with a fused optimizer (allocating megabytes every step costs more than the arithmetic);
        dense mode hands the gradients to .grad, so it gets a fresh one each time."""
        flat = self._backward_buffers
        if flat is None:
            flat = torch.zeros(sum(p.numel() for p in self.weights.values()), dtype=self.dtype, device=self.env.device)
            if self.optimizer is not None:
                self._backward_buffers = flat
        else:
            flat.zero_()
        views = [piece.view_as(p) for piece, p in zip(flat.split([p.numel() for p in self.weights.values()]),
                                                      self.weights.values())]
        return flat, views

    def all_reduce_gradients(self, flat: torch.Tensor) -> None:
        """dp_allreduce of every table's gradient, in place: a reduce-scatter then an all-gather per table,
        chunk k of a table's N values to rank k, rank i sending rank j 4 * (chunk_j + chunk_i) bytes.

        On 1 or 2 ranks that is exactly what one ring all-reduce of the whole buffer does (half of it each way
        in each phase), so the backend's all-reduce runs it in one collective; on more ranks a ring would route
        bytes through neighbours, so each table is reduce-scattered and all-gathered with all-to-alls.
        """
        W, me = self.env.world_size, self.env.rank
        sizes = [p.numel() for p in self.weights.values()]
        if W <= 2:
            bytes_to = [0] * W
            for size in sizes:
                chunks = dp_chunk_sizes(size, W)
                for j in range(W):
                    bytes_to[j] += flat.element_size() * (chunks[j] + chunks[me])
            all_reduce_sum(self.env, flat, bytes_to, "dp_allreduce")
            return
        for piece in flat.split(sizes):
            chunks = dp_chunk_sizes(piece.numel(), W)
            scattered = all_to_all(self.env, piece, chunks, [chunks[me]] * W, "dp_allreduce")
            mine = scattered.view(W, chunks[me]).sum(0)
            piece.copy_(all_to_all(self.env, mine.repeat(W), [chunks[me]] * W, chunks, "dp_allreduce"))

    @torch.no_grad()
    def apply_fused_update(self, grads: List[torch.Tensor]) -> None:
        """The fused optimizer's rule on the rows some rank's batch touched.

        SGD and (row-wise) Adagrad leave a row with a zero gradient unchanged, so they are applied to the whole
        table at once (no row gathering); Adam moves untouched rows too, so it gets the rows with a gradient.
        """
        self.num_updates += 1
        config = self.optimizer
        for param, grad, state in zip(self.weights.values(), grads, self.states):
            weight = param.data
            if config.optimizer == EmbOptimType.SGD:
                weight.add_(grad, alpha=-config.lr)
            elif config.optimizer == EmbOptimType.ADAGRAD:
                state["momentum1"].addcmul_(grad, grad)
                weight.addcdiv_(grad, state["momentum1"].sqrt().add_(config.eps), value=-config.lr)
            elif config.optimizer == EmbOptimType.ROWWISE_ADAGRAD:
                state["momentum1"].add_(grad.square().mean(1))
                weight.add_(grad * (-config.lr / (state["momentum1"].sqrt() + config.eps)).unsqueeze(1))
            else:
                rows = grad.ne(0).any(1).nonzero().squeeze(1)
                apply_row_update(config, weight, state, rows, grad.index_select(0, rows), self.num_updates)

    # -------------------------------------------------------------- state
    def local_shards(self) -> List[Tuple[str, ShardMetadata, torch.Tensor, Dict[str, torch.Tensor]]]:
        out = []
        for table, param, state in zip(self.tables, self.weights.values(), self.states):
            shard = ShardMetadata.on_rank(self.env.rank, 0, 0, table.num_embeddings, table.embedding_dim)
            out.append((table.name, shard, param, state))
        return out

    def shard_memory_bytes(self) -> Dict[str, int]:
        weights = sum(p.numel() * p.element_size() for p in self.weights.values())
        state = sum(t.numel() * t.element_size() for s in self.states for t in s.values())
        return {"weights": weights, "optimizer": state}


class _ReplicaLookup(torch.autograd.Function):
    """Forward: embedding_bag (or embedding) per feature on the local replica. Backward: the dense gradient
    of each table, dp_allreduce, then the fused update (no .grad) or the summed gradient (into .grad)."""

    @staticmethod
    def forward(ctx, group: "DataParallelSharding", batch: FeatureBatch, *weights: torch.Tensor) -> torch.Tensor:
        ctx.group, ctx.batch = group, batch
        outputs = []
        for f, t in zip(group.features, group.feature_table):
            ids, lengths = batch.values[f], batch.lengths[f]
            if group.pooled:
                offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=ids.device)
                torch.cumsum(lengths, 0, out=offsets[1:])
                psw = batch.weights[f] if group.weighted else None
                outputs.append(F.embedding_bag(ids, weights[t], offsets, mode="sum", per_sample_weights=psw,
                                               include_last_offset=True).t())
            else:
                outputs.append(F.embedding(ids, weights[t]).reshape(-1))
        return torch.cat(outputs) if len(outputs) > 1 else outputs[0].contiguous()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        group, batch = ctx.group, ctx.batch
        flat, grads = group.gradient_buffer()
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
        group.all_reduce_gradients(flat)
        if group.optimizer is not None:
            group.apply_fused_update(grads)
            return (None, None) + (None,) * len(grads)
        return (None, None) + tuple(grads)
