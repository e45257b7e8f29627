"""The fused optimizer of sharded collections: TorchRec's `DMP.fused_optimizer` and `sharded_module.fused_optimizer`.

The updates themselves happen in backward, inside each shard's kernel; this KeyedOptimizer shows the shards'
weights and optimizer state under the unsharded model's names, and pushes a changed lr into every shard.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

import torch

from rectoolkit.distributed.state import collection_state_prefix
from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.optim.keyed import KeyedOptimizer


# fbgemm's names of the optimizer states after the first, which TorchRec calls "momentum1" whatever the optimizer
LATER_STATE_NAMES = {EmbOptimType.ADAM: ["exp_avg_sq"]}


def torchrec_state_names(table: str, state: Mapping[str, torch.Tensor],
                         optimizer: EmbOptimType) -> Dict[str, torch.Tensor]:
    """A shard's optimizer state under TorchRec's names (the same tensors).

        >>> list(torchrec_state_names("t0", {"momentum1": 1, "momentum2": 2}, EmbOptimType.ADAM))
        ['t0.momentum1', 't0.exp_avg_sq']
    """
    later = LATER_STATE_NAMES.get(optimizer, [])
    names = ["momentum1"] + [later[i] if i < len(later) else name for i, name in enumerate(list(state)[1:])]
    return {f"{table}.{name}": value for name, value in zip(names, state.values())}


class ShardedFusedOptimizer(KeyedOptimizer):
    """The fused embedding optimizer of every local shard, keyed like TorchRec's DMP.fused_optimizer.

    Updates happen in backward; step() pushes a changed lr (param_groups[0]["lr"]) into every shard.
    Keys: "<collection path>.<embedding_bags|embeddings>.<table>.weight" (+ ".<row>.<col>" when a rank
    holds several shards of one table). Each shard's state is named as in TorchRec: "<table>.momentum1" for the
    first state, then fbgemm's name of the next ("<table>.exp_avg_sq" for Adam's second moment). TorchRec holds each
    as a ShardedTensor; here it is this rank's shard of it, a plain tensor.
    """

    def __init__(self, sharded: Mapping[str, Any]) -> None:
        self._collections = [c for c in sharded.values() if c.fused_optimizer_config is not None]
        params: Dict[str, torch.Tensor] = {}
        states: Dict[Any, Any] = {}
        for path, collection in sharded.items():
            if collection.fused_optimizer_config is None:
                continue
            prefix = (path + "." if path else "") + collection_state_prefix(collection)
            # only the shards whose optimizer is fused (compute_kernel "dense" shards belong to the dense one)
            entries = [e for e in collection.local_shards() if hasattr(e[2], "_in_backward_optimizers")]
            per_table: Dict[str, int] = {}
            for table, _, _, _ in entries:
                per_table[table] = per_table.get(table, 0) + 1
            for table, shard, weight, state in entries:
                key = f"{prefix}{table}.weight"
                if per_table[table] > 1:
                    key += f".{shard.shard_offsets[0]}.{shard.shard_offsets[1]}"
                params[key] = weight
                # listed even without state (SGD), as in TorchRec
                states[weight] = torchrec_state_names(table, state, collection.fused_optimizer_config.optimizer)
        lr = self._collections[0].fused_optimizer_config.lr if self._collections else 0.0
        super().__init__(params, states, [{"params": list(params.values()), "lr": lr}])

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        lr = float(self.param_groups[0]["lr"])
        for collection in self._collections:
            collection.set_learning_rate(lr)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: fused updates never write .grad."""
