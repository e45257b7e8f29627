"""TorchRec's torchrec.distributed.train_pipeline.pipeline_context: the type variables of the pipelines (`In`, the
batch; `Out`, what `progress()` returns) and TrainPipelineContext, the per-batch record TorchRec's
TrainPipelineSparseDist keeps (`context_type`, whose default it is; the context of `sync_embeddings`).

    >>> from rectoolkit.distributed.train_pipeline import TrainPipelineBase
    >>> from rectoolkit.train import Batch
    >>> TrainPipelineBase[Batch, torch.Tensor].__origin__ is TrainPipelineBase   # TorchRec's annotations work
    True
    >>> context = TrainPipelineContext(index=3)
    >>> context.index, context.module_contexts, context.version
    (3, {}, 0)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple, TypeVar

import torch

from rectoolkit.streamable import Pipelineable

__all__ = ["In", "Out", "TrainPipelineContext"]

In = TypeVar("In", bound=Pipelineable)
Out = TypeVar("Out")


@dataclasses.dataclass
class TrainPipelineContext:
    """TorchRec's TrainPipelineContext, field for field: what TorchRec's pipeline holds for one batch in flight.
    rectoolkit's pipelines keep their own record of a batch in flight, so they create none of these: the class is
    here as the value of TrainPipelineSparseDist's `context_type` (TorchRec's default, the one accepted) and for
    code that builds one (e.g. to call `sync_embeddings`).

    Fields (TorchRec's): input_dist_splits_requests and input_dist_tensors_requests (module path -> the awaitable
    of each input_dist stage), module_contexts and module_contexts_next_batch (module path -> its context),
    fused_splits_awaitables, events (stream events), postproc_fwd_results, index (of the batch) and version.
    """

    input_dist_splits_requests: Dict[str, Any] = dataclasses.field(default_factory=dict)
    input_dist_tensors_requests: Dict[str, Any] = dataclasses.field(default_factory=dict)
    module_contexts: Dict[str, Any] = dataclasses.field(default_factory=dict)
    module_contexts_next_batch: Dict[str, Any] = dataclasses.field(default_factory=dict)
    fused_splits_awaitables: List[Tuple[List[str], Any]] = dataclasses.field(default_factory=list)
    events: List[torch.Event] = dataclasses.field(default_factory=list)
    postproc_fwd_results: Dict[str, Any] = dataclasses.field(default_factory=dict)
    index: Optional[int] = None
    version: int = 0
