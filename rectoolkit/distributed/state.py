"""Global (unsharded) tensors of a sharded collection: gather a table from its shards, or load one into them.

Both are collectives over the collection's ranks (every rank calls them, in the same order). Gathering
moves each shard once, from its owner, with broadcasts, so the bits are exactly the shard's bits.

    >>> import rectoolkit as rtk
    >>> from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                                           feature_names=["f"])])
    >>> plan = {"t": rtk.ParameterSharding("row_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])}
    >>> sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    >>> torch.equal(gather_table(sharded, "t"), ebc.embedding_bags["t"].weight)
    True
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist

from rectoolkit.modules.mixed_dtypes import table_dtype
from rectoolkit.plan.types import ShardingType


def _local_index(collection) -> Dict[Tuple[str, int, int], torch.Tensor]:
    """(table, row offset, column offset) -> this rank's weight tensor of that shard."""
    return {(table, *shard.shard_offsets): weight for table, shard, weight, _ in collection.local_shards()}


def _config(collection, table: str):
    for config in collection.embedding_configs():
        if config.name == table:
            return config
    raise KeyError(f"the sharded collection has no table {table!r}; it has "
                   f"{[c.name for c in collection.embedding_configs()]}")


@torch.no_grad()
def gather_table(collection, table: str, local: Optional[Dict] = None) -> torch.Tensor:
    """The whole [rows, dim] table on every rank, assembled from its shards (collective)."""
    env = collection.env
    config = _config(collection, table)
    local = _local_index(collection) if local is None else local
    ps = collection.module_plan[table]
    if ShardingType.parse(ps.sharding_type) == ShardingType.DATA_PARALLEL:
        return local[(table, 0, 0)].detach().clone()
    full = torch.empty(config.num_embeddings, config.embedding_dim, dtype=table_dtype(config.data_type),
                       device=env.device)
    for shard in ps.shards:
        (r0, r1), (c0, c1) = shard.rows, shard.columns
        if shard.rank == env.rank:
            buffer = local[(table, r0, c0)].detach().to(full.dtype).contiguous()
        else:
            buffer = torch.empty(r1 - r0, c1 - c0, dtype=full.dtype, device=env.device)
        if env.world_size > 1:
            dist.broadcast(buffer, src=shard.rank, group=env.pg)
        full[r0:r1, c0:c1] = buffer
    return full


@torch.no_grad()
def load_table(collection, table: str, full: torch.Tensor, local: Optional[Dict] = None) -> None:
    """Copy this rank's slices of a global [rows, dim] tensor into its shards (no communication)."""
    config = _config(collection, table)
    if tuple(full.shape) != (config.num_embeddings, config.embedding_dim):
        raise ValueError(f"table {table!r}: got a tensor of shape {tuple(full.shape)}, the table is "
                         f"{config.num_embeddings} x {config.embedding_dim}")
    local = _local_index(collection) if local is None else local
    for (name, r0, c0), weight in local.items():
        if name == table:
            weight.copy_(full[r0:r0 + weight.shape[0], c0:c0 + weight.shape[1]])


def collection_state_prefix(collection) -> str:
    """'embedding_bags.' for bag collections, 'embeddings.' for sequence ones (the unsharded modules' names)."""
    return "embedding_bags." if hasattr(collection, "embedding_bag_configs") else "embeddings."
