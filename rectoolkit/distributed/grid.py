"""GRID_SHARD: a table is cut into column blocks, and each block into row blocks over the ranks of one host.

    input_dist         for each column block: the ids of feature f bucketed by its row blocks   (all-to-all)
    lookup             each rank pools the ids of its (row block, column block)
    output_dist_intra  partial sums to the gateway of the requesting rank on the block's host   (all-to-all + sum)
    output_dist_inter  each reduced column block to the requesting rank, who puts the column
                       blocks side by side: [B, dim]                                            (all-to-all)

COLUMN_WISE and TABLE_ROW_WISE combined; the two output levels are those of table_row_wise.py.
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.distributed.bags import FeatureBatch, ReceivedIds, ids_to_owners
from rectoolkit.distributed.group import EmbeddingShardingGroup, require
from rectoolkit.distributed.table_row_wise import TwoLevelRoutes
from rectoolkit.plan.types import ShardingType


class GridSharding(EmbeddingShardingGroup):
    """The GRID_SHARD tables of one sharded collection."""

    sharding_type = ShardingType.GRID_SHARD

    def __init__(self, env, tables, output_keys, module_plan, key_offsets, *args, **kwargs) -> None:
        super().__init__(env, tables, output_keys, module_plan, key_offsets, *args, **kwargs)
        self.routes = TwoLevelRoutes(env, self.bags_by_owner, key_offsets)  # checks: one host per column block

    def check_table_plan(self, table, ps) -> None:
        by_columns = {}
        for s in ps.shards:
            by_columns.setdefault(s.columns, set()).add(s.rank // self.env.local_world_size)
        spread = {cols: sorted(hosts) for cols, hosts in by_columns.items() if len(hosts) > 1}
        require(not spread, table, ps, f"column blocks {spread} have row blocks on several hosts "
                f"(local_world_size={self.env.local_world_size})")

    def input_dist(self, batch: FeatureBatch) -> ReceivedIds:
        return ids_to_owners(self.env, batch, self.bags_by_owner, self.weighted, self.keep_positions())

    def lookup(self, received: ReceivedIds) -> torch.Tensor:
        return self.local.lookup(received)

    def output_dist(self, looked_up: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        if not self.pooled:
            return self.sequence_output_dist(looked_up, received)
        reduced = self.routes.to_requesters(looked_up, received.batch_sizes)
        return reduced, self.routes.final_columns
