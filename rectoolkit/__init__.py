"""rectoolkit: recommendation-system embeddings you can see, shard and run.

The names below mirror TorchRec's, so `import rectoolkit as torchrec` runs TorchRec tutorial code.
"""

from rectoolkit.modules.configs import (
    DataType,
    EmbeddingBagConfig,
    EmbeddingConfig,
    PoolingType,
)
from rectoolkit.plan import (
    EmbeddingComputeKernel,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
    ShardMetadata,
)
from rectoolkit.workloads import Workload, load_workload

__version__ = "0.1.0"
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingBagCollectionInterface, EmbeddingCollection
from rectoolkit.streamable import Multistreamable, Pipelineable
from rectoolkit.optim import CombinedOptimizer, EmbeddingFusedOptimizer, KeyedOptimizer, KeyedOptimizerWrapper
from rectoolkit.kernels import EmbOptimType, FusedOptimizerConfig, fbgemm_available
from rectoolkit import launch
from rectoolkit.launch import LaunchTimeout, WorkerError
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv, load_checkpoint, save_checkpoint
from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, PlannerError, PlanReport, Topology
from rectoolkit import fx, quant, streamable  # noqa: E402,F401 (attributes after `import torchrec`, as there)
