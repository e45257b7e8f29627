"""TorchRec's train pipelines (torchrec.distributed.train_pipeline): the next batches' input_dist, and with
TrainPipelineSemiSync their embedding lookup, run ahead of this batch's step.

One module per pipeline: sparse_dist (TrainPipeline, TrainPipelineBase, TrainPipelineSparseDist,
EvalPipelineSparseDist), semi_sync (TrainPipelineSemiSync), fused (TrainPipelineFusedSparseDist,
PrefetchTrainPipelineSparseDist); train_pipelines is TorchRec's module path to them.
"""

from rectoolkit.distributed.train_pipeline.train_pipelines import (
    EvalPipelineSparseDist,
    PrefetchTrainPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineFusedSparseDist,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

__all__ = ["EvalPipelineSparseDist", "PrefetchTrainPipelineSparseDist", "TrainPipeline", "TrainPipelineBase",
           "TrainPipelineFusedSparseDist", "TrainPipelineSemiSync", "TrainPipelineSparseDist"]
