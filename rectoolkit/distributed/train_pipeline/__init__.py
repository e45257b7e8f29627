"""TorchRec's train pipelines (torchrec.distributed.train_pipeline): the next batches' input_dist, and with
TrainPipelineSemiSync their embedding lookup, run ahead of this batch's step.

One module per pipeline: sparse_dist (TrainPipeline, TrainPipelineBase, TrainPipelineSparseDist,
EvalPipelineSparseDist), semi_sync (TrainPipelineSemiSync); train_pipelines is TorchRec's module path to them.
"""

from rectoolkit.distributed.train_pipeline.train_pipelines import (
    EvalPipelineSparseDist,
    TrainPipeline,
    TrainPipelineBase,
    TrainPipelineSemiSync,
    TrainPipelineSparseDist,
)

__all__ = ["EvalPipelineSparseDist", "TrainPipeline", "TrainPipelineBase", "TrainPipelineSemiSync",
           "TrainPipelineSparseDist"]
