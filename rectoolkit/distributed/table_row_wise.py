"""TABLE_ROW_WISE: a table is cut into row blocks over the ranks of ONE host (L = local_world_size ranks).

    input_dist         the ids of feature f are bucketed by row block; bucket k -> its rank   (all-to-all)
    lookup             each rank pools the ids of its block: a partial sum per sample
    output_dist_intra  each rank sends its partial sums for rank i to the *gateway* of i on its own host,
                       g = host * L + local(i); the gateway adds them up                      (all-to-all + sum)
    output_dist_inter  the gateway sends rank i the reduced [B, dim]                           (all-to-all)

Routing is row-wise's (row_wise.bucket_by_rows); the output combination is two-level (two_level.py), so only
reduced sums cross hosts. Bytes (rectoolkit.plan.traffic): intra 4 * B_i * dim per (row block, feature);
inter 4 * B_i * dim per (column block, feature). With a batch size per feature (VBE), S_i(f) in place of B_i
at both levels, plus a 4-byte count per feature shard to its owner and per (feature, host) to the source's
gateway on that host. Sequence outputs (EmbeddingCollection) go back in one level, as for ROW_WISE.
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.distributed.feature_shards import ReceivedIds, ShardingGroupSpec
from rectoolkit.distributed.group import require
from rectoolkit.distributed.row_wise import RowWiseSharding
from rectoolkit.distributed.two_level import TwoLevelRoutes
from rectoolkit.plan.types import ShardingType


class TableRowWiseSharding(RowWiseSharding):
    """The TABLE_ROW_WISE tables of one sharded collection: row-wise routing, two-level output."""

    sharding_type = ShardingType.TABLE_ROW_WISE

    def __init__(self, spec: ShardingGroupSpec) -> None:
        super().__init__(spec)
        # (checks: one host per column block)
        self.routes = TwoLevelRoutes(self.env, self.by_owner, spec.key_offsets, spec.qcomm_codecs_registry)
        self.gateway_keys = self.routes.gateway_keys

    def check_table_plan(self, table, ps) -> None:
        require(all(s.columns == (0, table.embedding_dim) for s in ps.shards), table, ps,
                "a row block does not hold all columns (use GRID_SHARD to cut columns too)")
        hosts = {s.rank // self.env.local_world_size for s in ps.shards}
        require(len(hosts) == 1, table, ps, f"its row blocks sit on hosts {sorted(hosts)} "
                f"(local_world_size={self.env.local_world_size}); keep them on one host, or use ROW_WISE")

    def pooled_output_dist(self, pooled: torch.Tensor, received: ReceivedIds) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.routes.to_requesters(pooled, received), self.routes.final_columns
