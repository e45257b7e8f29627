"""Sharding plans: types, exact traffic accounting, hand edits, JSON and TorchRec interop."""

from rectoolkit.plan.types import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from rectoolkit.plan.traffic import COLLECTIVES, batch_id_counter, expected_id_counter, step_traffic
from rectoolkit.plan.validation import PlanValidationError, validate_module_plan, validate_plan
from rectoolkit.plan.serialization import load_plan, plan_from_json, plan_to_json, save_plan
from rectoolkit.plan.torchrec_interop import from_torchrec, to_torchrec
from rectoolkit.plan.edits import MoveError, check_move, move_shard
