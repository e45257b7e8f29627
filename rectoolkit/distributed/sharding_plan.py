"""TorchRec's module path torchrec.distributed.sharding_plan (a path module: re-exports only; see rectoolkit.compat).

The per-table generators live in rectoolkit.plan.constructors; construct_module_sharding_plan and the default
sharders in rectoolkit.quant.shard_modules (the defaults include the quantized collection's sharder).
"""

from rectoolkit.plan.constructors import (
    ParameterShardingGenerator,
    calculate_shard_sizes_and_offsets,
    column_wise,
    data_parallel,
    get_sharding_constructor_from_type,
    grid_shard,
    placement,
    placement_helper,
    row_wise,
    table_row_wise,
    table_wise,
)
from rectoolkit.quant.shard_modules import (
    apply_to_all,
    construct_module_sharding_plan,
    get_default_sharders,
    get_module_to_default_sharders,
)

__all__ = ["ParameterShardingGenerator", "apply_to_all", "calculate_shard_sizes_and_offsets", "column_wise", "construct_module_sharding_plan",
           "data_parallel", "get_default_sharders", "get_module_to_default_sharders",
           "get_sharding_constructor_from_type", "grid_shard", "placement", "placement_helper", "row_wise",
           "table_row_wise", "table_wise"]
