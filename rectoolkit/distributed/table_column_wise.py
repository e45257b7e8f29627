"""TABLE_COLUMN_WISE: COLUMN_WISE whose column blocks all sit on the ranks of ONE host (L = local_world_size).

    input_dist    every id of feature f  ->  the owner of each column block (once per block)   (all-to-all)
    lookup        each owner pools its blocks for the samples of every rank
    output_dist   each owner sends each rank its [B, block cols] pooled block back              (all-to-all)
                  and the receiver puts the blocks side by side: [B, dim]

Everything runs as column_wise.py; only the placement differs, as in TorchRec (TwCwPooledEmbeddingSharding is
its CwPooledEmbeddingSharding): a table's blocks stay inside one host, so the ids of a feature go to one host
and its pooled blocks come back from one. Bytes (rectoolkit.plan.traffic): as COLUMN_WISE.
"""

from __future__ import annotations

from rectoolkit.distributed.column_wise import ColumnWiseSharding
from rectoolkit.distributed.group import require
from rectoolkit.plan.types import ShardingType


class TableColumnWiseSharding(ColumnWiseSharding):
    """The TABLE_COLUMN_WISE tables of one sharded collection: column-wise, the blocks of a table on one host."""

    sharding_type = ShardingType.TABLE_COLUMN_WISE

    def check_table_plan(self, table, ps) -> None:
        super().check_table_plan(table, ps)
        hosts = {s.rank // self.env.local_world_size for s in ps.shards}
        require(len(hosts) == 1, table, ps, f"its column blocks sit on hosts {sorted(hosts)} "
                f"(local_world_size={self.env.local_world_size}); keep them on one host, or use COLUMN_WISE")
