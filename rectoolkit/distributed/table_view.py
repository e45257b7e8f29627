"""A sharded collection's own module view, as TorchRec's: one module per table under the unsharded collection's
names, "embedding_bags.<table>.weight" (sequence collections: "embeddings.<table>.weight").

    sharded.embedding_bags["t0"].weight   this rank's shard of t0 (the Parameter the kernel looks up and updates)
    sharded.state_dict()                  {"embedding_bags.t0.weight": t0 as a ShardedTensor, ...} (TorchRec's)
    sharded.load_state_dict(state)        each rank copies its slices of whole tables, or its local shards of
                                          ShardedTensors saved under the same plan (no communication)

So `named_parameters()`, `parameters()`, `state_dict()` and `load_state_dict()` of a sharded collection, or of a
model holding one, give TorchRec's keys; the sharding groups (input_dist, lookup, output_dist) are not submodules
(TorchRec's `_lookups` are a plain list too), so their internal names never show.

- A table with no shard on this rank has TorchRec's placeholder: an empty float32 `weight` of shape (0,) (marked as
  fused into backward when the table's kernel is, as TorchRec marks it), so every rank lists every table; it lives
  on the shards' device (TorchRec's on the CPU), so that all of a DMP's parameters are on its device.
- A table with several shards on this rank (column shards placed on one rank) registers the first as `weight` and
  the others as `weight_1`, `weight_2`, ... (TorchRec lists one `weight` spanning them: its kernel stores them
  back to back); they are all in `parameters()`, and state_dict still has one entry under `weight`: a
  ShardedTensor with each of them as a local shard.
- `state_dict()` holds a ShardedTensor per table, as TorchRec's and DistributedModelParallel.state_dict() do
  (rectoolkit.distributed.state: no communication); `rectoolkit.distributed.full_state_dict(sharded)` gives whole
  tables instead (a collective), which load into a collection of any plan.

    >>> import rectoolkit as rtk
    >>> from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                                           feature_names=["f"])])
    >>> plan = {"t": rtk.ParameterSharding("row_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])}
    >>> sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    >>> [(name, tuple(weight.shape)) for name, weight in sharded.named_parameters()]
    [('embedding_bags.t.weight', (4, 2))]
    >>> torch.equal(sharded.state_dict()["embedding_bags.t.weight"], ebc.embedding_bags["t"].weight)  # (one process)
    True
"""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch
from torch import nn

from rectoolkit.distributed.state import gather_group, load_table, needs_gather, table_state


class ShardedTable(nn.Module):
    """One table of a sharded collection: its local shards as parameters, and as its state (state.table_state)."""

    def __init__(self, collection: nn.Module, table: str, shards: Sequence[nn.Parameter], fused: bool) -> None:
        super().__init__()
        self.__dict__["_collection"] = collection  # not a submodule (it owns this view)
        self.table = table
        if shards:
            self.weight = shards[0]
            for k, extra in enumerate(shards[1:], start=1):
                self.register_parameter(f"weight_{k}", extra)
        else:  # TorchRec's placeholder for a table with no shard here (on the shards' device: TorchRec's is on CPU)
            self.weight = nn.Parameter(torch.empty(0, device=collection.env.device))
            if fused:
                self.weight._in_backward_optimizers = ["fused"]

    def _save_to_state_dict(self, destination: Dict, prefix: str, keep_vars: bool) -> None:
        collection = self._collection
        if not collection.__dict__.get("_skip_table_state", False):
            destination[prefix + "weight"] = table_state(collection, self.table, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        key = prefix + "weight"
        if key not in state_dict:
            missing_keys.append(key)
        else:
            try:
                load_table(self._collection, self.table, state_dict[key])
            except ValueError as error:
                error_msgs.append(f"{key}: {error}")
        if strict:
            unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k != key)

    def extra_repr(self) -> str:
        shards = [tuple(p.shape) for p in self._parameters.values()]
        return f"table={self.table!r}, local shards={shards}"


def table_view(collection: nn.Module, fused_tables: Sequence[str]) -> nn.ModuleDict:
    """One ShardedTable per table of `collection`, in its table order, holding this rank's shards."""
    shards: Dict[str, List[nn.Parameter]] = {}
    for table, _, weight, _ in collection.local_shards():
        shards.setdefault(table, []).append(weight)
    fused = set(fused_tables)
    if needs_gather(collection):  # the group full_state_dict() meets on (every rank shards the collection: made here)
        gather_group(collection.env, create=True)
    return nn.ModuleDict({config.name: ShardedTable(collection, config.name, shards.get(config.name, []),
                                                    config.name in fused)
                          for config in collection.embedding_configs()})


class table_state_skipped:
    """Within it, the collections' state_dict() leaves their tables out: for state saved by one rank alone, such
    as a checkpoint's dense part."""

    def __init__(self, collections: Sequence[nn.Module]) -> None:
        self.collections = list(collections)

    def __enter__(self) -> "table_state_skipped":
        for collection in self.collections:
            collection.__dict__["_skip_table_state"] = True
        return self

    def __exit__(self, *exc) -> None:
        for collection in self.collections:
            collection.__dict__.pop("_skip_table_state", None)
