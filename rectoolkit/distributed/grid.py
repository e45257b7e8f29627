"""GRID_SHARD: a table is cut into column blocks, and each block into row blocks over the ranks of one host.

    input_dist         for each column block: the ids of feature f bucketed by its row blocks   (all-to-all)
    lookup             each rank pools the ids of its (row block, column block)
    output_dist_intra  partial sums to the gateway of the requesting rank on the block's host   (all-to-all + sum)
    output_dist_inter  each reduced column block to the requesting rank, who puts the column
                       blocks side by side: [B, dim]                                            (all-to-all)

COLUMN_WISE and TABLE_ROW_WISE combined: the routing and the two output levels are table_row_wise.py's, per
column block; only the plan shape differs. Bytes (rectoolkit.plan.traffic): as TABLE_ROW_WISE, per column
block (its cols in place of dim).
"""

from __future__ import annotations

from rectoolkit.distributed.group import require
from rectoolkit.distributed.table_row_wise import TableRowWiseSharding
from rectoolkit.plan.types import ShardingType


class GridSharding(TableRowWiseSharding):
    """The GRID_SHARD tables of one sharded collection: table-row-wise, per column block."""

    sharding_type = ShardingType.GRID_SHARD

    def check_table_plan(self, table, ps) -> None:
        by_columns = {}
        for s in ps.shards:
            by_columns.setdefault(s.columns, set()).add(s.rank // self.env.local_world_size)
        spread = {cols: sorted(hosts) for cols, hosts in by_columns.items() if len(hosts) > 1}
        require(not spread, table, ps, f"column blocks {spread} have row blocks on several hosts "
                f"(local_world_size={self.env.local_world_size})")
