"""TorchRec's module path torchrec.distributed.planner.types (a path module, see rectoolkit.compat): the planner's
input types. The planner itself is rectoolkit.planner; TorchRec's other names here (ShardingOption, Storage, the
Enumerator / Proposer / Partitioner interfaces, ...) describe parts of TorchRec's planner that rectoolkit's does not
have (docs/cost_model.md)."""

from rectoolkit.distributed.types import ModuleSharder, ShardingPlan, StorageUsageType
from rectoolkit.modules.configs import DataType
from rectoolkit.plan.types import BoundsCheckMode, CacheParams
from rectoolkit.planner import ParameterConstraints, PlannerError, Topology
from rectoolkit.planner.hardware import DeviceHardware, Perf, Storage
from rectoolkit.planner.planner import PlannerErrorType

# (TorchRec's module imports ModuleSharder, ShardingPlan and StorageUsageType from torchrec.distributed.types, and
# code imports them from here: `from torchrec.distributed.planner.types import ParameterConstraints, ShardingPlan`)
__all__ = ["BoundsCheckMode", "CacheParams", "DataType", "DeviceHardware", "ModuleSharder", "ParameterConstraints", "Perf",
           "PlannerError", "PlannerErrorType", "ShardingPlan", "Storage", "StorageUsageType", "Topology"]
