"""TorchRec's TrainPipelineFusedSparseDist and PrefetchTrainPipelineSparseDist: TrainPipelineSparseDist with one
more stage placed for GPUs. Both keep the plain loop's numbers; here they are tested bit-identical to it.

TrainPipelineFusedSparseDist starts the embedding lookup and output_dist of batch i at the start of step i, before
zero_grad (and, by default, before the input_dist of the batches ahead), where TorchRec's puts them on a side CUDA
stream so that they overlap the previous step's dense optimizer: the fused optimizers have already updated the
tables in backward. Here they run on the training thread, in that order; on CPU there is no stream to overlap
them with, as in TorchRec on CPU.

PrefetchTrainPipelineSparseDist adds a stage that prefetches the rows of batch i+1 into the caches of
FUSED_UVM_CACHING tables. rectoolkit's kernels keep no cache (a FUSED_UVM_CACHING table is looked up where it
lives), so there is nothing to prefetch and it trains as TrainPipelineSparseDist does; TorchRec's does the same on
CPU (its prefetch returns at once without a data_dist stream).

TorchRec's default pipeline_postproc=True asks that collections fed a KJT the model computes be pipelined too;
rectoolkit pipelines collections fed a field of the batch only, so True is refused on the first step
(NotImplementedError) for a model with another collection; False runs those inside the forward, as TorchRec does.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

from rectoolkit.distributed.train_pipeline.pipeline_context import In, Out
from rectoolkit.distributed.train_pipeline.sparse_dist import ModelForward, TrainPipelineSparseDist, _refuse

__all__ = ["PrefetchTrainPipelineSparseDist", "TrainPipelineFusedSparseDist"]

EMB_LOOKUP_STREAMS = ("new", "current", "data_dist")


class TrainPipelineFusedSparseDist(TrainPipelineSparseDist[In, Out]):
    """TorchRec's TrainPipelineFusedSparseDist: the lookup and output_dist of batch i start the step, before
    zero_grad; the numbers are the plain loop's.

    Args (TorchRec's): model, optimizer, device, execute_all_batches, custom_model_fwd, apply_jit,
        enable_inplace_copy_batch, enqueue_batch_after_forward, free_features_storage_early, clear_data_dist_inputs
        as in TrainPipelineSparseDist; pipeline_postproc as in the module docstring.
        emb_lookup_stream: "new", "current" or "data_dist" (TorchRec's default): the CUDA stream of the lookup. On
            CPU there are no streams and the three are the same (in TorchRec too); on a CUDA device the lookup runs
            on the current stream, so only "current" is accepted there.
        embedding_lookup_after_data_dist: False (default): the lookup of batch i runs before the input_dist work
            of the batches ahead starts; True: after.
        strict: TorchRec 1.8 accepts it and does nothing with it; only False is accepted here.
        background_input_dist (rectoolkit's): as in TrainPipelineSparseDist.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, execute_all_batches: bool = True,
                 apply_jit: bool = False, pipeline_postproc: bool = True,
                 custom_model_fwd: Optional[ModelForward] = None, strict: bool = False,
                 emb_lookup_stream: str = "data_dist", embedding_lookup_after_data_dist: bool = False,
                 enable_inplace_copy_batch: bool = False, enqueue_batch_after_forward: bool = False,
                 free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False,
                 background_input_dist: bool = True) -> None:
        if emb_lookup_stream not in EMB_LOOKUP_STREAMS:
            raise RuntimeError(f"TrainPipelineFusedSparseDist: unknown emb_lookup_stream {emb_lookup_stream!r}; "
                               f"give one of {EMB_LOOKUP_STREAMS}")
        if torch.device(device).type == "cuda":
            _refuse("emb_lookup_stream", emb_lookup_stream, "current",
                    "on CUDA the lookup runs on the current stream, not a side stream of its own")
        _refuse("strict", strict, False, "TorchRec 1.8's TrainPipelineFusedSparseDist does not use it either")
        super().__init__(model, optimizer, device, execute_all_batches=execute_all_batches, apply_jit=apply_jit,
                         custom_model_fwd=custom_model_fwd, enable_inplace_copy_batch=enable_inplace_copy_batch,
                         enqueue_batch_after_forward=enqueue_batch_after_forward,
                         free_features_storage_early=free_features_storage_early,
                         clear_data_dist_inputs=clear_data_dist_inputs, background_input_dist=background_input_dist)
        self._pipeline_postproc = bool(pipeline_postproc)
        self._lookup_after_data_dist = bool(embedding_lookup_after_data_dist)

    def _before_work_ahead(self) -> None:
        if not self._lookup_after_data_dist:
            self._start_lookup()

    def _train_step(self, batch: Any, after_forward: Callable[[], None] = lambda: None) -> Any:
        if self._lookup_after_data_dist and self._input_paths is not None:
            self._start_lookup()
        return super()._train_step(batch, after_forward)

    def _start_lookup(self) -> None:
        """Lookup and output_dist of batch i, for every pipelined collection in one fixed order; its forward uses
        them (with their graph: backward reaches the tables as in the plain loop)."""
        for path, input_dist in sorted(self._ahead[0].items()):
            module = self._sharded[path]
            module.use_input_dist(input_dist)
            module.use_output(input_dist.features, module(input_dist.features).wait())


class PrefetchTrainPipelineSparseDist(TrainPipelineSparseDist[In, Out]):
    """TorchRec's PrefetchTrainPipelineSparseDist: TrainPipelineSparseDist plus a cache prefetch of batch i+1,
    which has nothing to do here (rectoolkit's kernels keep no cache; see the module docstring). The numbers are
    the plain loop's.

    Args (TorchRec's): model, optimizer, device, execute_all_batches, apply_jit, custom_model_fwd,
        enable_inplace_copy_batch, free_features_storage_early, clear_data_dist_inputs as in
        TrainPipelineSparseDist; pipeline_postproc (TorchRec's default True) as in the module docstring.
        background_input_dist (rectoolkit's): as in TrainPipelineSparseDist.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, execute_all_batches: bool = True,
                 apply_jit: bool = False, pipeline_postproc: bool = True,
                 custom_model_fwd: Optional[ModelForward] = None, enable_inplace_copy_batch: bool = False,
                 free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False,
                 background_input_dist: bool = True) -> None:
        super().__init__(model, optimizer, device, execute_all_batches=execute_all_batches, apply_jit=apply_jit,
                         custom_model_fwd=custom_model_fwd, enable_inplace_copy_batch=enable_inplace_copy_batch,
                         free_features_storage_early=free_features_storage_early,
                         clear_data_dist_inputs=clear_data_dist_inputs, background_input_dist=background_input_dist)
        self._pipeline_postproc = bool(pipeline_postproc)
