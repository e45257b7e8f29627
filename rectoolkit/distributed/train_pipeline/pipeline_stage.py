"""TorchRec's pipeline stages (torchrec.distributed.train_pipeline.pipeline_stage): PipelineStage, one step of a
StagedTrainPipeline, and SparseDataDistUtil, whose stage runs the sharded collections' input_dist ahead.

With SparseDataDistUtil's stage last, a StagedTrainPipeline hands out batch i while the input_dist of batch i+1 is
on its way; the caller runs the model:

    sdd = SparseDataDistUtil(dmp, data_dist_stream=None)
    pipeline = StagedTrainPipeline([PipelineStage("data_copy", lambda batch: batch.to(device), None),
                                    sdd.start_sparse_data_dist_stage()])
    while (batch := pipeline.progress(dataloader_iter)) is not None:
        optimizer.zero_grad(); loss, _ = dmp(batch); loss.backward(); optimizer.step()

`start_sparse_data_dist(batch)` (the stage) starts the first half of the input_dist of its batch (split, route,
sizes); `dmp(batch)` then skips the collections' own input_dist for that very batch object, and after its forward
the ids of the next batches start, so they travel during backward (TorchRec's order: its forward hook calls
wait_sparse_data_dist). The first forward runs plain: it shows which field of the batch each sharded collection
gets, as in TrainPipelineSparseDist. The ids of a batch do not depend on the weights: the numbers are the plain
loop's, bit for bit. Everything runs on the calling thread, in one order on every rank (every rank must call
progress() and the model equally often).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Optional, TypeVar

import torch
from torch import nn

from rectoolkit.distributed.train_pipeline.batch_fields import FieldPath, follow, path_to
from rectoolkit.distributed.train_pipeline.sparse_dist import _ahead_env, _dmp_of, _refuse

__all__ = ["PipelineStage", "SparseDataDistUtil", "StageOut"]

StageOut = TypeVar("StageOut")


@dataclasses.dataclass
class PipelineStage:
    """TorchRec's PipelineStage: one step of a StagedTrainPipeline, a function of the previous stage's output
    (independent of the model's backward: a device copy, a preprocessing, an input_dist).

    Args:
        name: for logs.
        runnable: output = runnable(input).
        stream: the CUDA stream it runs on; None (or a CPU stream) on CPU.
        fill_callback: called after the stage runs while the pipeline fills.
        data_exhausted_callback: called when the stage has no batch to run on (the dataloader ran out).
    """

    name: str
    runnable: Callable[[Any], Any]
    stream: Optional[Any] = None
    fill_callback: Optional[Callable[[], None]] = None
    data_exhausted_callback: Optional[Callable[[], None]] = None


def is_cuda_stream(stream: Any) -> bool:
    device = getattr(stream, "device", None)
    return device is not None and torch.device(device).type == "cuda"


class SparseDataDistUtil:
    """TorchRec's SparseDataDistUtil: the input_dist of a DistributedModelParallel's sharded collections as a
    stage of a StagedTrainPipeline (see the module docstring).

    Args (TorchRec's):
        model: the DistributedModelParallel the caller runs on the batches (`model(batch)`).
        data_dist_stream: the stream of the input_dist: None or a CPU stream, or on CUDA the current stream (the
            input_dist runs there; another stream is refused).
        pipeline_postproc: False: a collection fed a KJT the model computes keeps its input_dist in the forward;
            True would pipeline the modules computing it, which rectoolkit does not: refused on the first forward
            for a model with such a collection.
    apply_jit, prefetch_stream (a cache prefetch stage: rectoolkit's kernels keep no cache) and
    embedding_lookup_stream (a semi-synchronous lookup stage: use TrainPipelineSemiSync) are accepted at their
    defaults only (a NotImplementedError otherwise).
    """

    def __init__(self, model: nn.Module, data_dist_stream: Optional[Any] = None, apply_jit: bool = False,
                 prefetch_stream: Optional[Any] = None, pipeline_postproc: bool = False,
                 embedding_lookup_stream: Optional[Any] = None) -> None:
        _refuse("apply_jit", apply_jit, False, "the model runs eagerly")
        if prefetch_stream is not None:
            raise NotImplementedError("SparseDataDistUtil(prefetch_stream=...): rectoolkit's kernels keep no cache to "
                                      "prefetch into, so there is no prefetch stage; leave it at None")
        if embedding_lookup_stream is not None:
            raise NotImplementedError("SparseDataDistUtil(embedding_lookup_stream=...): there is no semi-synchronous "
                                      "lookup stage here; leave it at None (TrainPipelineSemiSync looks batch i+1 up "
                                      "before the backward of batch i)")
        if is_cuda_stream(data_dist_stream) and data_dist_stream != torch.cuda.current_stream(data_dist_stream.device):
            raise NotImplementedError("SparseDataDistUtil: the input_dist runs on the current CUDA stream here, not "
                                      "a side stream; pass data_dist_stream=torch.cuda.current_stream() (or None)")
        dmp = _dmp_of(model)
        self.model, self.data_dist_stream, self.apply_jit = model, data_dist_stream, apply_jit
        self.prefetch_stream = self.embedding_lookup_stream = None
        self._sharded = dmp.sharded_modules
        self._ahead_env = _ahead_env(dmp.env)
        self._pipeline_postproc = bool(pipeline_postproc)
        self._input_paths: Optional[Dict[str, FieldPath]] = None  # found on the first forward
        # batches given to the stage and not yet forwarded, oldest first: [batch, {path: InputDistAhead} or None
        # while the paths are not known]
        self._in_flight: List[List[Any]] = []
        self._forwarding: Optional[List[Any]] = None  # the entry of the batch in the model's forward now
        self._received: Dict[str, Any] = {}  # first forward: what each sharded collection got
        self._hooks: List[Any] = []
        self._first_forward_hooks: List[Any] = []
        self.initialized = False
        self._exhausting_mode = False

    @property
    def pipelined_modules(self) -> List[str]:
        """Paths (in the DMP) of the sharded collections whose input_dist runs ahead."""
        return sorted(self._input_paths or {})

    # ------------------------------------------------------------------ the stage
    def start_sparse_data_dist(self, batch: Any) -> Any:
        """The stage: start the input_dist of `batch` (sizes first; the ids follow after the next forward) and
        return the batch."""
        if not self.initialized:
            self._attach()
        self._in_flight.append([batch, self._start(batch) if self._input_paths is not None else None])
        return batch

    def wait_sparse_data_dist(self) -> None:
        """Send the ids of every batch in flight whose sizes have gone (TorchRec: wait for the splits and start
        the tensors' all-to-all)."""
        for _, started in self._in_flight:
            for input_dist in (started or {}).values():
                input_dist.send()

    def wait_sdd_fill_callback(self) -> None:
        """The stage's fill_callback: while the pipeline fills, no forward sends the ids; this does."""
        self.wait_sparse_data_dist()

    def data_exhausted_callback(self) -> None:
        self._exhausting_mode = True

    def start_sparse_data_dist_stage(self, name: str = "start_sparse_data_dist",
                                     runnable: Optional[Callable[[Any], Any]] = None) -> PipelineStage:
        """TorchRec's: the PipelineStage of start_sparse_data_dist (last in the StagedTrainPipeline)."""
        return PipelineStage(name=name, runnable=runnable or self.start_sparse_data_dist, stream=self.data_dist_stream,
                             fill_callback=self.wait_sdd_fill_callback,
                             data_exhausted_callback=self.data_exhausted_callback)

    def detach(self) -> nn.Module:
        """TorchRec's: the model without the pipeline's hooks (its forward runs its own input_dist); the batches in
        flight are kept, and the next start_sparse_data_dist re-attaches."""
        for hook in self._hooks + self._first_forward_hooks:
            hook.remove()
        self._hooks, self._first_forward_hooks, self._forwarding = [], [], None
        self.initialized = False
        return self.model

    # ------------------------------------------------------------------ around the model's forward
    def _attach(self) -> None:
        self._hooks = [self.model.register_forward_pre_hook(self._before_forward),
                       self.model.register_forward_hook(self._after_forward)]
        self.initialized = True

    def _start(self, batch: Any) -> Dict[str, Any]:
        return {path: self._sharded[path].start_input_dist(follow(batch, field_path), self._ahead_env)
                for path, field_path in sorted(self._input_paths.items())}

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        batch = args[0] if args else None
        position = next((k for k, (in_flight, _) in enumerate(self._in_flight) if in_flight is batch), None)
        if position is None:  # a batch the stage has not seen: the model runs its own input_dist
            self._forwarding = None
            return
        for _, skipped in self._in_flight[:position]:  # handed out and never forwarded: complete and drop them
            for input_dist in (skipped or {}).values():
                input_dist.wait()
        self._forwarding = self._in_flight[position]
        del self._in_flight[:position + 1]
        if self._input_paths is None:
            self._received = {}
            self._first_forward_hooks = [sharded.register_forward_pre_hook(
                lambda sharded, sharded_args, path=path: self._received.setdefault(path, sharded_args[0]))
                for path, sharded in self._sharded.items()]
            return
        for path, input_dist in self._forwarding[1].items():
            self._sharded[path].use_input_dist(input_dist)

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        forwarded, self._forwarding = self._forwarding, None
        if forwarded is None:
            return
        if self._input_paths is None:
            self._find_input_paths(forwarded[0])
        self.wait_sparse_data_dist()  # the ids of the next batches travel during backward

    def _find_input_paths(self, batch: Any) -> None:
        for hook in self._first_forward_hooks:
            hook.remove()
        self._first_forward_hooks = []
        paths = {path: field_path for path, features in self._received.items()
                 if (field_path := path_to(batch, features)) is not None}
        fed_elsewhere = sorted(set(self._received) - set(paths))
        self._received = {}
        if self._pipeline_postproc and fed_elsewhere:
            raise NotImplementedError(
                f"SparseDataDistUtil(pipeline_postproc=True): the sharded collections {fed_elsewhere} are fed a KJT "
                "the model computes, not a field of the batch; rectoolkit does not pipeline the modules that compute "
                "it (TorchRec's postprocs); pass pipeline_postproc=False to run those collections' input_dist inside "
                "the forward, or feed them a field of the batch")
        self._input_paths = paths
        for entry in self._in_flight:  # the batches handed to the stage before the paths were known
            entry[1] = self._start(entry[0])
