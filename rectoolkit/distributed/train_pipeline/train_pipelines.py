"""TorchRec's path torchrec.distributed.train_pipeline.train_pipelines: the pipelines, re-exported from the
modules that hold them (sparse_dist, semi_sync, fused, staged, pt2, compiled_autograd)."""

from rectoolkit.distributed.train_pipeline.compiled_autograd import TrainPipelineSparseDistCompAutograd
from rectoolkit.distributed.train_pipeline.fused import PrefetchTrainPipelineSparseDist, TrainPipelineFusedSparseDist
from rectoolkit.distributed.train_pipeline.pt2 import TorchCompileConfig, TrainPipelinePT2
from rectoolkit.distributed.train_pipeline.semi_sync import TrainPipelineSemiSync
from rectoolkit.distributed.train_pipeline.staged import StagedTrainPipeline
from rectoolkit.distributed.train_pipeline.sparse_dist import (
    EvalPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
    TrainPipelineSparseDistLite,
)

__all__ = ["EvalPipelineSparseDist", "PrefetchTrainPipelineSparseDist", "StagedTrainPipeline", "TorchCompileConfig",
           "TrainPipeline", "TrainPipelineBase", "TrainPipelineFusedSparseDist", "TrainPipelinePT2",
           "TrainPipelineSemiSync", "TrainPipelineSparseDist", "TrainPipelineSparseDistCompAutograd",
           "TrainPipelineSparseDistLite"]
