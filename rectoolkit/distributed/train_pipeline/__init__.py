"""TorchRec's train pipelines (torchrec.distributed.train_pipeline): the next batches' input_dist, and with
TrainPipelineSemiSync their embedding lookup, run ahead of this batch's step.

One module per pipeline: sparse_dist (TrainPipeline, TrainPipelineBase, TrainPipelineSparseDist,
TrainPipelineSparseDistLite, EvalPipelineSparseDist), semi_sync (TrainPipelineSemiSync), fused (TrainPipelineFusedSparseDist,
PrefetchTrainPipelineSparseDist), staged (StagedTrainPipeline), pt2 (TrainPipelinePT2, TorchCompileConfig),
compiled_autograd (TrainPipelineSparseDistCompAutograd), pipeline_stage (PipelineStage,
SparseDataDistUtil, StageOut); gradient_accumulation (GradientAccumulationConfig,
GradientAccumulationWrapper); utils (DataLoadingThread); pipeline_context (In, Out, TrainPipelineContext);
train_pipelines is TorchRec's module path to the pipelines.
"""

from rectoolkit.distributed.train_pipeline.gradient_accumulation import (
    GradientAccumulationConfig,
    GradientAccumulationWrapper,
)
from rectoolkit.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
from rectoolkit.distributed.train_pipeline.pipeline_stage import PipelineStage, SparseDataDistUtil, StageOut
from rectoolkit.distributed.train_pipeline.train_pipelines import (
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    StagedTrainPipeline,
    TorchCompileConfig,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelinePT2,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
    TrainPipelineSparseDistCompAutograd,
)
from rectoolkit.distributed.train_pipeline.utils import DataLoadingThread

__all__ = ["DataLoadingThread", "EvalPipelineSparseDist", "GradientAccumulationConfig", "GradientAccumulationWrapper",
           "In", "Out", "PipelineStage", "PrefetchTrainPipelineSparseDist", "SparseDataDistUtil", "StageOut",
           "StagedTrainPipeline", "TorchCompileConfig", "TrainPipeline", "TrainPipelineBase", "TrainPipelineContext",
           "TrainPipelineFusedSparseDist", "TrainPipelinePT2", "TrainPipelineSemiSync", "TrainPipelineSparseDist",
           "TrainPipelineSparseDistCompAutograd"]
