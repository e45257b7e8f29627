"""COLUMN_WISE: a table is cut into column blocks, each block placed like a table of its own.

    input_dist    every id of feature f  ->  the owner of each column block (once per block)   (all-to-all)
    lookup        each owner pools its blocks for the samples of every rank
    output_dist   each owner sends each rank its [B, block cols] pooled block back              (all-to-all)
                  and the receiver puts the blocks side by side: [B, dim]

Routing and output are table-wise's, block by block: a column block lands in columns [col_start, col_end)
of its feature's output, so placing the blocks is concatenating them.
Bytes (rectoolkit.plan.traffic): per block, rank i sends its owner 4 B_i + 8 * ids (blocks on one rank are
still sent separately), and the owner returns 4 * B_i * block cols.
"""

from __future__ import annotations

from rectoolkit.distributed.group import require
from rectoolkit.distributed.table_wise import TableWiseSharding
from rectoolkit.plan.types import ShardingType


class ColumnWiseSharding(TableWiseSharding):
    """The COLUMN_WISE tables of one sharded collection: table-wise, per column block."""

    sharding_type = ShardingType.COLUMN_WISE

    def check_table_plan(self, table, ps) -> None:
        require(all(s.rows == (0, table.num_embeddings) for s in ps.shards), table, ps,
                "a column block does not hold all rows (use GRID_SHARD to cut rows too)")
