"""The fused optimizers of sharded collections: TorchRec's `sharded_module.fused_optimizer` and `DMP.fused_optimizer`.

The updates themselves happen in backward, inside each shard's kernel. These keyed optimizers show the shards'
weights and optimizer state under TorchRec's names and push a changed lr into the kernels, nested as TorchRec
nests them:

    dmp.fused_optimizer                    CombinedOptimizer([("ebc", ...), ("ec", ...)])  one entry per sharded module
      dmp.module.ebc.fused_optimizer       CombinedOptimizer([("", ...), ("", ...)])       one entry per sharding group
        GroupFusedOptimizer                params "embedding_bags.<table>.weight", one param group {"params", "lr"}

so `dmp.fused_optimizer.params` holds "ebc.embedding_bags.t1.weight", `param_groups` one group per sharding group
(each its own lr, as TorchRec's per-lookup optimizers), and `CombinedOptimizer([("fused", dmp.fused_optimizer),
("dense", ...)])` works as in TorchRec.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import torch

from rectoolkit.distributed.state import collection_state_prefix
from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.optim.fused import set_lr_only
from rectoolkit.optim.keyed import CombinedOptimizer, KeyedOptimizer


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


class GroupFusedOptimizer(KeyedOptimizer):
    """The fused optimizer of one sharding group's shards on this rank (TorchRec's EmbeddingFusedOptimizer, one per
    lookup). Keys "<embedding_bags|embeddings>.<table>.weight"; each table a ShardedTensor of this rank's shards, its
    state "<table>.momentum1" for the first state, then fbgemm's name of the next ("<table>.exp_avg_sq" for Adam's
    second moment), ShardedTensors in TorchRec's layout (sharded_state.py) over the kernel's own tensors, so DCP
    saves and reshards them. Without a process group of the whole world: this rank's tensors, one key per shard
    when it holds several of a table (".<row offset>.<column offset>" added). step() and zero_grad() push
    param_groups[0]["lr"] into the group's kernel, as TorchRec's do."""

    def __init__(self, group: Any, prefix: str, optimizer: EmbOptimType, lr: float) -> None:
        self._group = group
        entries = [e for e in group.local_shards() if hasattr(e[2], "_in_backward_optimizers")]
        per_table: Dict[str, List[Tuple[Any, torch.Tensor, Dict[str, torch.Tensor]]]] = {}
        for table, shard, weight, state in entries:
            per_table.setdefault(table, []).append((shard, weight, torchrec_state_names(table, state, optimizer)))
        # (torch's ShardedTensor module costs 70 ms to import: loaded when a fused optimizer is built)
        from rectoolkit.distributed.sharded_state import sharded_tensor_group, table_sharded_tensors

        process_group = sharded_tensor_group(group.env)
        configs = {t.name: t for t in group.tables}
        params: Dict[str, torch.Tensor] = {}
        states: Dict[Any, Any] = {}
        for table, local in per_table.items():
            key = f"{prefix}{table}.weight"
            if process_group is not None:  # TorchRec's: one ShardedTensor param per table, its states sharded
                config = configs[table]
                weight, state = table_sharded_tensors(table, config.num_embeddings, config.embedding_dim,
                                                      group.module_plan[table].shards, local, process_group,
                                                      group.env.local_world_size)
                params[key] = weight
                states[weight] = state  # listed even without state (SGD)
                continue
            for shard, weight, state in local:  # no process group: this rank's tensors
                params[key if len(local) == 1 else f"{key}.{shard.shard_offsets[0]}.{shard.shard_offsets[1]}"] = weight
                states[weight] = state
        self._pushed_lr = float(lr)
        super().__init__(params, states, [{"params": list(params.values()), "lr": float(lr)}])

    def _push_lr(self) -> None:
        lr = float(self.param_groups[0]["lr"])
        if lr != self._pushed_lr:
            self._group.set_learning_rate(lr)
            self._pushed_lr = lr

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        self._push_lr()
        return loss

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Nothing to clear (fused updates never write .grad); pushes the lr, as TorchRec's."""
        self._push_lr()

    def post_load_state_dict(self) -> None:
        self._push_lr()

    def init_state(self, sparse_grad_parameter_names: Any = None) -> None:
        """Nothing to create: the kernel's state exists from the start (and a fused table takes no gradient)."""
        self._push_lr()

    def _load_state_tensor(self, value: torch.Tensor, saved: Any, where: str) -> None:
        from rectoolkit.distributed.sharded_state import ShardedTensor, copy_into_sharded

        if isinstance(value, ShardedTensor):
            copy_into_sharded(value, saved, where)
        else:
            super()._load_state_tensor(value, saved, where)

    def set_optimizer_step(self, step: int) -> None:
        """TorchRec's: the fused optimizer's step count from here on (Adam's bias correction reads it)."""
        self._group.set_optimizer_step(step)

    def update_hyper_parameters(self, params_dict: Mapping[str, Any]) -> None:
        """TorchRec's: new hyper-parameters for the kernel; here "lr" (the param group's lr, pushed at once)."""
        if set_lr_only(self, params_dict, "after sharding here (only 'lr'); set them in the sharder's fused_params"):
            self._push_lr()

    def __repr__(self) -> str:  # TorchRec's name, in torch's layout ("EmbeddingFusedOptimizer (\nParameter Group 0 ...")
        return torch.optim.Optimizer.__repr__(self).replace(type(self).__name__, "EmbeddingFusedOptimizer", 1)


def collection_fused_optimizer(collection: Any) -> CombinedOptimizer:
    """A sharded collection's fused optimizer: a CombinedOptimizer of one GroupFusedOptimizer per sharding group that
    holds fused shards on this rank, keyed "" (so its keys are the groups' own), in TorchRec's order: sharding types
    by their first table in the collection's order."""
    config = collection.fused_optimizer_config
    if config is None:
        return CombinedOptimizer([])
    first_table = {table.name: index for index, table in enumerate(collection.embedding_configs())}
    groups = sorted(collection.groups.values(), key=lambda g: min(first_table[t.name] for t in g.tables))
    prefix = collection_state_prefix(collection)
    optimizers: List[GroupFusedOptimizer] = [GroupFusedOptimizer(group, prefix, config.optimizer, config.lr)
                                             for group in groups]
    return CombinedOptimizer([("", optimizer) for optimizer in optimizers if optimizer.params])


def model_fused_optimizer(sharded: Mapping[str, Any]) -> CombinedOptimizer:
    """DistributedModelParallel's fused optimizer: each sharded collection's, keyed by its path in the model (TorchRec
    lists every sharded module, an empty one too)."""
    return CombinedOptimizer([(path, collection.fused_optimizer) for path, collection in sharded.items()])
