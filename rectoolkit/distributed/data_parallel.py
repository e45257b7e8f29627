"""DATA_PARALLEL: a full replica of the table on every rank.

    input_dist    nothing: each rank looks up its own samples
    lookup        the local replica pools the local batch
    output_dist   nothing
    backward      the tables' dense gradients are all-reduced (dp_allreduce, replicas.py), then the fused
                  optimizer's rule is applied or the summed gradient is left in .grad (dense)

Gradients are SUMMED over ranks (not averaged), so that a replica's gradient equals the unsharded table's
gradient on the global batch, as for every other sharding type.
Bytes (rectoolkit.plan.traffic): with chunk k of the N = rows * dim values, rank i sends rank j
4 * (chunk_j + chunk_i).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from rectoolkit.distributed.feature_shards import FeatureBatch, ShardingGroupSpec
from rectoolkit.distributed.group import LocalShard, ShardingGroup, require
from rectoolkit.distributed.replicas import GradientBuffer, ReplicaLookup, all_reduce_gradients, make_replicas
from rectoolkit.kernels.fused_optimizers import apply_table_update, init_optimizer_state
from rectoolkit.plan.types import ShardingType, ShardMetadata


class DataParallelSharding(ShardingGroup):
    """The DATA_PARALLEL tables of one sharded collection (replicas, gradients all-reduced in backward)."""

    sharding_type = ShardingType.DATA_PARALLEL

    def __init__(self, spec: ShardingGroupSpec) -> None:
        super().__init__(spec)
        self.optimizer = spec.optimizer
        self.embedding_dim = spec.embedding_dim
        self.features = [f for t in self.tables for f in t.feature_names]
        self.feature_table = [i for i, t in enumerate(self.tables) for _ in t.feature_names]
        self.weights = make_replicas(spec)
        self.states = [init_optimizer_state(spec.optimizer, t.num_embeddings, t.embedding_dim, self.env.device)
                       if spec.optimizer else {} for t in self.tables]
        self.num_updates = 0
        self.gradients = GradientBuffer(reuse=spec.optimizer is not None)
        if spec.optimizer is not None:
            for param in self.weights.values():
                param._in_backward_optimizers = ["fused"]
        columns = [torch.arange(spec.key_offsets[key], spec.key_offsets[key] + t.embedding_dim)
                   for t, keys in zip(self.tables, spec.output_keys) for key in keys]
        self.register_buffer("out_columns", torch.cat(columns).to(self.env.device), persistent=False)

    def check_table_plan(self, table, ps) -> None:
        require(all(s.shard_sizes == [table.num_embeddings, table.embedding_dim] for s in ps.shards), table, ps,
                f"not every shard is the full {table.num_embeddings} x {table.embedding_dim} table")

    # -------------------------------------------------------------- the three steps
    def input_dist(self, batch: FeatureBatch) -> FeatureBatch:
        return batch  # nothing to send: each rank looks up its own samples

    def lookup(self, batch: FeatureBatch) -> torch.Tensor:
        """Pooled: [sum of dims, B] (transposed, like the other types). Sequence: flat rows of every id."""
        return ReplicaLookup.apply(self, batch, *self.weights.values())

    def output_dist(self, looked_up: torch.Tensor, batch: FeatureBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.pooled:
            return looked_up, self.out_columns  # nothing to send
        D, device = self.embedding_dim, looked_up.device
        where = [(batch.value_starts[f] + torch.arange(batch.values[f].numel(), device=device)).unsqueeze(1) * D
                 + torch.arange(D, device=device) for f in self.features]
        return looked_up, torch.cat(where).reshape(-1)

    # -------------------------------------------------------------- backward (called by ReplicaLookup)
    def reduce_and_update(self, flat: torch.Tensor, grads: List[torch.Tensor]) -> List[Optional[torch.Tensor]]:
        """All-reduce the gradients; apply the fused optimizer (nothing for autograd) or return them (.grad)."""
        all_reduce_gradients(self.env, flat, [g.numel() for g in grads])
        if self.optimizer is None:
            return [grad.to(param.dtype) for grad, param in zip(grads, self.weights.values())]  # (float16 replicas)
        self.num_updates += 1
        for param, grad, state in zip(self.weights.values(), grads, self.states):
            apply_table_update(self.optimizer, param.data, state, grad, self.num_updates)
        return [None] * len(grads)

    # -------------------------------------------------------------- state
    def set_learning_rate(self, lr: float) -> None:
        """The replicas' fused rule runs here (apply_table_update), with this group's own config."""
        if self.optimizer is not None:
            self.optimizer.lr = float(lr)

    def set_optimizer_step(self, step: int) -> None:
        self.num_updates = int(step)

    def local_shards(self) -> List[LocalShard]:
        return [(t.name, ShardMetadata.on_rank(self.env.rank, 0, 0, t.num_embeddings, t.embedding_dim), param, state)
                for t, param, state in zip(self.tables, self.weights.values(), self.states)]

    def shard_memory_bytes(self) -> Dict[str, int]:
        weights = sum(p.numel() * p.element_size() for p in self.weights.values())
        state = sum(t.numel() * t.element_size() for s in self.states for t in s.values())
        return {"weights": weights, "optimizer": state}
