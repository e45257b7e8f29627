"""A ManagedCollisionCollection sharded row-wise (TorchRec's `torchrec.distributed.mc_modules`).

Each table is ROW_WISE: row block k (rows [start_k, end_k)) lives on one rank, and so does the managed-collision
module of those rows (`rebuild_with_output_id_range`: zch_size = end_k - start_k, the block's last row reserved
for its misses). Ids are bucketed by *input* id, as TorchRec buckets them: with n blocks, bucket k holds the ids
in [k * ceil(input_hash_size / n), (k + 1) * ceil(input_hash_size / n)) and goes to block k's owner.

    input_dist    hashed ids of table t, bucketed -> bucket k to block k's owner          (all-to-all)
    remap         each owner records (training) and remaps the ids it received into its rows
    output_dist   the rows go back to the ranks that asked, in their order               (all-to-all)

The remapped ids then go through the sharded embedding collection, whose row-wise input_dist sends every row to
the same owner. Bytes: rank i sends block k's owner 8 * (its ids in bucket k) and gets as many back, plus one
int64 count per rank and table.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import torch
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv, all_to_all
from rectoolkit.distributed.interfaces import ShardedModule
from rectoolkit.distributed.sharders import ModuleSharder
from rectoolkit.modules.mc_modules import (
    ManagedCollisionCollection, MCHManagedCollisionModule, features_by_table, with_remapped_ids)
from rectoolkit.plan.types import ParameterSharding, ShardingType
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor


# TorchRec's managed-collision buffers that are not sharded by rows (the others are: one entry per row of the block)
NOT_PER_ROW = ("_output_segments_tensor", "_current_iter_tensor", "_scalar_logger._scalar_logger_steps",
               "_hash_zch_bucket")


class ShardedManagedCollisionCollection(ShardedModule):
    """This rank's managed-collision modules (one per table whose row block it owns) and the routing of ids."""

    def __init__(self, module: ManagedCollisionCollection, module_plan: Mapping[str, ParameterSharding],
                 env: ShardingEnv) -> None:
        super().__init__()
        self.env = env
        self._table_to_features = dict(module._table_to_features)
        self._unsharded = dict(module._managed_collision_modules.items())  # hashing only (a plain dict: no state)
        self._managed_collision_modules = nn.ModuleDict()
        self._bucket_owners: Dict[str, List[int]] = {}
        self._row_blocks: Dict[str, Tuple[int, List[Tuple[int, int, int]]]] = {}  # table -> (my start, blocks)
        for config in module.embedding_configs():
            ps = module_plan.get(config.name)
            if ps is None or ShardingType.parse(ps.sharding_type) != ShardingType.ROW_WISE:
                kind = "no entry" if ps is None else f"sharding type {ps.sharding_type!r}"
                raise NotImplementedError(
                    f"ShardedManagedCollisionCollection: table {config.name!r} has {kind} in the plan; a "
                    "managed-collision table is sharded ROW_WISE only (as in TorchRec): plan it 'row_wise' (e.g. "
                    "ParameterConstraints(sharding_types=['row_wise']))")
            unsharded = module._managed_collision_modules[config.name]
            if not isinstance(unsharded, MCHManagedCollisionModule):
                raise NotImplementedError(f"ShardedManagedCollisionCollection: table {config.name!r} has a "
                                          f"{type(unsharded).__name__}; only MCHManagedCollisionModule is sharded")
            blocks = sorted(ps.shards, key=lambda shard: shard.shard_offsets[0])
            segments = [block.shard_offsets[0] for block in blocks] + [config.num_embeddings]
            self._bucket_owners[config.name] = [block.rank for block in blocks]
            mine = [block for block in blocks if block.rank == env.rank]
            if len(mine) > 1:
                raise NotImplementedError(f"ShardedManagedCollisionCollection: table {config.name!r} has "
                                          f"{len(mine)} row blocks on rank {env.rank}; plan one block per rank")
            if mine:
                start = mine[0].shard_offsets[0]
                self._managed_collision_modules[config.name] = unsharded.rebuild_with_output_id_range(
                    (start, start + mine[0].shard_sizes[0]), segments, device=env.device)
                self._row_blocks[config.name] = (start, [(b.shard_offsets[0], b.shard_sizes[0], b.rank)
                                                         for b in blocks])
        self._register_state_dict_hook(_row_blocks_as_sharded_tensors)
        self._register_load_state_dict_pre_hook(_row_blocks_from_saved, with_module=True)

    def _per_row_buffers(self):
        """(name in this module, table, buffer) of each per-row state buffer of this rank's row blocks: what
        TorchRec's shards (all the persistent buffers but its bookkeeping ones)."""
        for table, module in self._managed_collision_modules.items():
            start, blocks = self._row_blocks[table]
            rows = next(n for first, n, rank in blocks if first == start)
            for name, buffer in module.named_buffers():
                if name in NOT_PER_ROW or name in module._non_persistent_buffers_set:
                    continue
                if buffer.dim() > 0 and buffer.shape[0] == rows:
                    yield f"_managed_collision_modules.{table}.{name}", table, buffer

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The ids of this rank's samples remapped into global rows, keys in the tables' order."""
        features, per_table = features_by_table(features, self._table_to_features)
        values = [self._remap_on_owners(table, kjt) for table, kjt in zip(self._table_to_features, per_table)]
        return with_remapped_ids(features, values, [kjt.lengths() for kjt in per_table])

    def _remap_on_owners(self, table: str, kjt: KeyedJaggedTensor) -> torch.Tensor:
        unsharded = self._unsharded[table]
        ids = unsharded.preprocess({table: JaggedTensor(values=kjt.values(), lengths=kjt.lengths())})[table].values()
        owners = self._bucket_owners[table]
        bucket_size = -(-unsharded.input_size() // len(owners))
        buckets = torch.div(ids, bucket_size, rounding_mode="floor").clamp(max=len(owners) - 1)
        destination = torch.tensor(owners, dtype=torch.int64, device=ids.device)[buckets]
        order = torch.argsort(destination, stable=True)
        W = self.env.world_size
        send_counts = torch.bincount(destination, minlength=W)
        receive_counts = all_to_all(self.env, send_counts, [1] * W, [1] * W, name="mc_counts")
        sends, receives = send_counts.tolist(), receive_counts.tolist()
        received = all_to_all(self.env, ids[order].to(torch.int64), sends, receives, name="mc_ids")
        local = self._managed_collision_modules[table] if table in self._managed_collision_modules else None
        if local is not None:  # already hashed: record and remap only
            mine = local.profile({table: JaggedTensor(values=received, lengths=received.new_tensor([len(received)]))})
            received = local.remap(mine)[table].values()
        rows_in_order = all_to_all(self.env, received, receives, sends, name="mc_rows")
        rows = torch.empty_like(rows_in_order)
        rows[order] = rows_in_order
        return rows.to(kjt.values().dtype)

    def evict(self) -> Dict[str, object]:
        """Each local table's rows evicted since the last call (global row ids; None where none)."""
        return {table: module.evict() for table, module in self._managed_collision_modules.items()}

    def open_slots(self) -> Dict[str, torch.Tensor]:
        """Each local table's count of free slots in this rank's row block."""
        return {table: module.open_slots() for table, module in self._managed_collision_modules.items()}


def _row_blocks_as_sharded_tensors(module: ShardedManagedCollisionCollection, state_dict: Dict[str, Any],
                                   prefix: str, local_metadata: Any) -> None:
    """state_dict hook: each per-row buffer as a ShardedTensor of the table's row blocks (TorchRec's), so that
    torch.distributed.checkpoint saves every rank's block: under one key as plain tensors, DCP would take them for
    replicas and keep one rank's. Plain without a process group of the whole world."""
    from rectoolkit.distributed.sharded_state import row_block_sharded_tensor, sharded_tensor_group

    group = sharded_tensor_group(module.env)
    if group is None:
        return
    for name, table, buffer in module._per_row_buffers():
        key = prefix + name
        if key in state_dict:
            start, blocks = module._row_blocks[table]
            state_dict[key] = row_block_sharded_tensor(state_dict[key], start, blocks, group)


def _row_blocks_from_saved(module: ShardedManagedCollisionCollection, state_dict: Dict[str, Any], prefix: str,
                           *args: Any) -> None:
    """load_state_dict pre-hook: this rank's block of each saved per-row buffer (a ShardedTensor's local shard, or
    the rows of a whole tensor)."""
    from rectoolkit.distributed.sharded_state import local_rows

    for name, table, buffer in module._per_row_buffers():
        key = prefix + name
        if key in state_dict:
            start, _ = module._row_blocks[table]
            state_dict[key] = local_rows(state_dict[key], start, buffer.shape[0], f"managed-collision state {key!r}")


class ManagedCollisionCollectionSharder(ModuleSharder):
    """TorchRec's sharder of a ManagedCollisionCollection: ROW_WISE, with the embedding collection it remaps for
    (ManagedCollisionEmbeddingBagCollectionSharder takes one and calls it). Standalone sharding is not offered,
    as in TorchRec: `shardable_parameters` raises.

        >>> ManagedCollisionCollectionSharder().sharding_types("cpu")
        ['row_wise']
    """

    module_type = ManagedCollisionCollection

    def shard(self, module: ManagedCollisionCollection, params: Mapping[str, ParameterSharding], env: Any,
              embedding_shardings: Any = None, device: Any = None, use_index_dedup: bool = False
              ) -> ShardedManagedCollisionCollection:
        """This rank's managed-collision modules for the row blocks `params` give it. `embedding_shardings`
        (TorchRec passes its embedding collection's) is not needed here: the ids go to the plan's row blocks."""
        if use_index_dedup:
            raise NotImplementedError("ManagedCollisionCollectionSharder.shard(use_index_dedup=True): ids are sent "
                                      "as they are here (no dedup before the all-to-all); leave it False")
        if not isinstance(module, ManagedCollisionCollection):
            raise TypeError(f"ManagedCollisionCollectionSharder.shard: got a {type(module).__name__}, this sharder "
                            "shards ManagedCollisionCollection")
        if not isinstance(env, ShardingEnv):
            env = ShardingEnv.from_process_group(env, device=device)
        return ShardedManagedCollisionCollection(module, dict(params), env)

    def shardable_parameters(self, module: nn.Module) -> Dict[str, nn.Parameter]:
        raise NotImplementedError("ManagedCollisionCollectionSharder: a managed-collision collection is sharded with "
                                  "its embedding collection (ManagedCollisionEmbeddingBagCollectionSharder), as in "
                                  "TorchRec; it has no parameters of its own to plan")

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return [ShardingType.ROW_WISE.value]
