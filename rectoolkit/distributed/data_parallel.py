"""DATA_PARALLEL: a full replica of the table on every rank.

    input_dist    nothing: each rank looks up its own samples
    lookup        the local replica pools the local batch
    output_dist   nothing
    backward      the tables' dense gradients are all-reduced (dp_allreduce, replicas.py) and AVERAGED over the
                  ranks into the replicas' .grad; your dense optimizer updates them

Gradient accumulation, as DDP's no_sync (the collection's `no_sync()`, entered by GradientAccumulationWrapper on
its no-sync micro-batches): the backward of a lookup run inside it sends nothing and adds this rank's own gradient
to .grad, unaveraged as DDP leaves it; the next backward outside it all-reduces the replicas' whole .grad with its
own gradient and divides by the world size (DDP's all-reduce of the accumulated .grad), so the step sees what an
all-reduce in every micro-batch gives, to float rounding, for the bytes of one. A step that no synced backward
came before (a partial group at the end) calls `reduce_accumulated()` first, so the replicas stay equal.

As TorchRec 1.8's DATA_PARALLEL (the DENSE kernel, its lookup wrapped in DistributedDataParallel): a replica is a
plain parameter, not marked `_in_backward_optimizers`, so `in_backward_optimizer_filter(model.named_parameters())`
gives it to the dense optimizer you build, and no fused optimizer (the collection's, the sharder's fused_params,
apply_optimizer_in_backward's) updates it or lists it in `fused_optimizer`. Its gradient is averaged like DDP's,
whatever set_gradient_division says (that switch divides the other types' gradients only, as TorchRec's).
Bytes (rectoolkit.plan.traffic): with chunk k of the N = rows * dim values, rank i sends rank j
4 * (chunk_j + chunk_i).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from rectoolkit.distributed.feature_shards import FeatureBatch, ShardingGroupSpec
from rectoolkit.distributed.group import LocalShard, ShardingGroup, require
from rectoolkit.distributed.replicas import ReplicaLookup, all_reduce_gradients, held_elsewhere, make_replicas
from rectoolkit.plan.types import ShardingType, ShardMetadata


class DataParallelSharding(ShardingGroup):
    """The DATA_PARALLEL tables of one sharded collection (replicas, gradients averaged over ranks in backward)."""

    sharding_type = ShardingType.DATA_PARALLEL

    def __init__(self, spec: ShardingGroupSpec) -> None:
        super().__init__(spec)
        if spec.optimizer is not None:
            raise ValueError(f"DATA_PARALLEL tables {[t.name for t in self.tables]}: a replica has the dense kernel, "
                             "trained by your dense optimizer; build its group without a fused optimizer")
        self.embedding_dim = spec.embedding_dim
        self.features = [f for t in self.tables for f in t.feature_names]
        self.feature_table = [i for i, t in enumerate(self.tables) for _ in t.feature_names]
        self.weights = make_replicas(spec)
        self.sync_gradients = True  # False inside the collection's no_sync(): read by each lookup's forward
        self.unsynced_grads = False  # a backward under no_sync left a local gradient in .grad, still to all-reduce
        self._gradient_buffer: Optional[torch.Tensor] = None  # the last backward's (replicas.py)
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
    def gradient_buffer(self, numel: int, device: torch.device) -> torch.Tensor:
        """A zeroed float32 buffer of `numel` values for the replicas' gradients: the last backward's, zeroed in
        place, when nothing else uses it any more; else a new one (replicas.py's docstring says why)."""
        buffer = self._gradient_buffer
        if buffer is None or buffer.numel() != numel or buffer.device != device or held_elsewhere(buffer):
            buffer = self._gradient_buffer = torch.zeros(numel, dtype=torch.float32, device=device)
        else:
            buffer.zero_()
        return buffer

    def reduce(self, flat: torch.Tensor, grads: List[torch.Tensor], divide_by: int, sync: bool = True
               ) -> List[torch.Tensor]:
        """All-reduce the gradients and divide them by `divide_by` (what the output's gradient was not already
        divided by, so that they end averaged); returned for autograd (.grad), in the replicas' dtype.

        With `sync` False (a lookup under no_sync) nothing is sent: this rank's gradient is returned as DDP leaves
        it, not divided (times world_size / divide_by). The next synced backward all-reduces it from .grad with its
        own, then divides by the world size, and .grad is replaced by the result (the module docstring)."""
        params = list(self.weights.values())
        undivided = self.env.world_size / divide_by  # what turns `flat` into this rank's undivided gradient
        if not sync:
            self.unsynced_grads = True
            if undivided != 1:
                flat.mul_(undivided)
        elif self.unsynced_grads:
            if undivided != 1:
                flat.mul_(undivided)
            for grad, param in zip(grads, params):
                if param.grad is not None:
                    grad.add_(param.grad)
                    param.grad = None  # autograd stores the all-reduced sum in its place
            all_reduce_gradients(self.env, flat, [g.numel() for g in grads])
            flat.div_(self.env.world_size)
            self.unsynced_grads = False
        else:
            all_reduce_gradients(self.env, flat, [g.numel() for g in grads])
            if divide_by != 1:
                flat.div_(divide_by)
        return [grad.to(param.dtype) for grad, param in zip(grads, params)]  # (float16 replicas)

    def reduce_accumulated(self) -> None:
        """All-reduce now what backwards under no_sync left in the replicas' .grad, averaged over the ranks (for a
        step that no synced backward came before); nothing when none is left. Collective: every rank calls it."""
        if not self.unsynced_grads:
            return
        params = list(self.weights.values())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).float().reshape(-1) for p in params])
        all_reduce_gradients(self.env, flat, [p.numel() for p in params])
        flat.div_(self.env.world_size)
        for piece, param in zip(flat.split([p.numel() for p in params]), params):
            param.grad = piece.view_as(param).to(param.dtype)
        self.unsynced_grads = False

    # -------------------------------------------------------------- state
    def local_shards(self) -> List[LocalShard]:
        """(table, the full replica, weight, no fused optimizer state) of every table."""
        return [(t.name, ShardMetadata.on_rank(self.env.rank, 0, 0, t.num_embeddings, t.embedding_dim), param, {})
                for t, param in zip(self.tables, self.weights.values())]

    def shard_memory_bytes(self) -> Dict[str, int]:
        """The replicas' bytes; their optimizer state is your dense optimizer's, not counted here."""
        return {"weights": sum(p.numel() * p.element_size() for p in self.weights.values()), "optimizer": 0}
