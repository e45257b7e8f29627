"""TorchRec's path torchrec.distributed.train_pipeline.train_pipelines: the pipelines, re-exported from the
modules that hold them (sparse_dist, semi_sync, fused, staged)."""

from rectoolkit.distributed.train_pipeline.fused import PrefetchTrainPipelineSparseDist, TrainPipelineFusedSparseDist
from rectoolkit.distributed.train_pipeline.semi_sync import TrainPipelineSemiSync
from rectoolkit.distributed.train_pipeline.staged import StagedTrainPipeline
from rectoolkit.distributed.train_pipeline.sparse_dist import (
    EvalPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
)

__all__ = ["EvalPipelineSparseDist", "PrefetchTrainPipelineSparseDist", "StagedTrainPipeline", "TrainPipeline",
           "TrainPipelineBase", "TrainPipelineFusedSparseDist", "TrainPipelineSemiSync", "TrainPipelineSparseDist"]
