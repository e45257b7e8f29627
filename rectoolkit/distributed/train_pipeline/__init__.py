"""TorchRec's train pipelines (torchrec.distributed.train_pipeline): the next batches' input_dist, and with
TrainPipelineSemiSync their embedding lookup, run ahead of this batch's step.

One module per pipeline: sparse_dist (TrainPipeline, TrainPipelineBase, TrainPipelineSparseDist,
EvalPipelineSparseDist), semi_sync (TrainPipelineSemiSync), fused (TrainPipelineFusedSparseDist,
PrefetchTrainPipelineSparseDist), staged (StagedTrainPipeline), pipeline_stage (PipelineStage, SparseDataDistUtil);
gradient_accumulation (GradientAccumulationConfig, GradientAccumulationWrapper); train_pipelines is TorchRec's module
path to the pipelines.
"""

from rectoolkit.distributed.train_pipeline.gradient_accumulation import (
    GradientAccumulationConfig,
    GradientAccumulationWrapper,
)
from rectoolkit.distributed.train_pipeline.pipeline_stage import PipelineStage, SparseDataDistUtil, StageOut
from rectoolkit.distributed.train_pipeline.train_pipelines import (
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    StagedTrainPipeline,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

__all__ = ["EvalPipelineSparseDist", "GradientAccumulationConfig", "GradientAccumulationWrapper", "PipelineStage", "PrefetchTrainPipelineSparseDist", "SparseDataDistUtil",
           "StageOut", "StagedTrainPipeline", "TrainPipeline", "TrainPipelineBase", "TrainPipelineFusedSparseDist",
           "TrainPipelineSemiSync", "TrainPipelineSparseDist"]
