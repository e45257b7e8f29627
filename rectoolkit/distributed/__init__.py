"""Sharded embedding modules on torch.distributed: instrumented collectives, one module per sharding type,
sharded collections, DistributedModelParallel and resharding checkpoints."""

from rectoolkit.distributed.comm import CommStats, ShardingEnv
from rectoolkit.distributed.sharded_ebc import ShardedEmbeddingBagCollection, shard_embedding_bag_collection
from rectoolkit.distributed.sharded_ec import ShardedEmbeddingCollection, shard_embedding_collection
from rectoolkit.distributed.model_parallel import DistributedModelParallel, ShardedFusedOptimizer
from rectoolkit.distributed.state import gather_table, load_table
from rectoolkit.distributed.checkpoint import load_checkpoint, save_checkpoint
