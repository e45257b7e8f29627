"""Sharded embedding modules on torch.distributed: instrumented collectives, one module per sharding type,
sharded collections, DistributedModelParallel, the train pipeline and resharding checkpoints."""

from rectoolkit.distributed.comm import CommStats, ShardingEnv
from rectoolkit.distributed.sharded_ebc import ShardedEmbeddingBagCollection, shard_embedding_bag_collection
from rectoolkit.distributed.sharded_ec import ShardedEmbeddingCollection, shard_embedding_collection
from rectoolkit.distributed.model_parallel import DistributedModelParallel
from rectoolkit.distributed.two_dimensional import DMPCollection
from rectoolkit.distributed.state import full_state_dict, gather_table, load_table
from rectoolkit.distributed.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from rectoolkit.distributed.agree import PlanMismatchError, check_same_plan
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
from rectoolkit.distributed.train_pipeline import (
    DataLoadingThread,
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

# TorchRec's module paths (torchrec.distributed.types, .planner, .embeddingbag, .embedding, .shard, .sharding_plan,
# .quant_embedding, .quant_embeddingbag, .fbgemm_qcomm_codec, ...), imported on first use so that
# `rectoolkit.distributed.planner.Topology` reads like TorchRec code without importing the planner (or the quantized
# modules) here.
_TORCHREC_PATHS = ("types", "embedding_types", "planner", "embeddingbag", "embedding", "fp_embeddingbag", "shard",
                   "sharding_plan", "quant_embedding", "comm_ops", "dist_data", "quant_embeddingbag",
                   "fbgemm_qcomm_codec", "utils", "collective_utils")


def __getattr__(name: str):
    if name in _TORCHREC_PATHS:
        import importlib

        return importlib.import_module(f"rectoolkit.distributed.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
