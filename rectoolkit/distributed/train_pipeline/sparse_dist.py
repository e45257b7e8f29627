"""TorchRec's train pipelines: the next batch's input_dist (and device copy) overlap this batch's step.

    pipeline = TrainPipelineSparseDist(dmp_model, optimizer, device)
    while True:
        try:
            losses_and_output = pipeline.progress(dataloader_iter)   # one training step
        except StopIteration:
            break                                                    # every batch was trained on

The model is called as `model(batch)` and returns `(loss, output)`, as in TorchRec (or give `custom_model_fwd`,
a function `batch -> (loss, output)`); `progress()` runs zero_grad, forward, backward (of the loss summed) and
`optimizer.step()` for one batch and returns `output`. The plain loop it replaces:

    for batch in dataloader:
        optimizer.zero_grad(); loss, output = model(batch.to(device)); loss.sum().backward(); optimizer.step()

`TrainPipelineSparseDist` does the same work in this order (step i):

    wait       the ids of batch i, sent at the start of step i-1 (the time shows in CommStats.wait_s["input_dist"])
    load       batch i+2 from the dataloader; its copy to the device starts (a side stream on CUDA)
    send       input_dist of batch i+1, second stage: its sizes (sent during step i-1) are read, its ids'
               all-to-all starts; it travels during the whole of step i
    start      input_dist of batch i+2, first stage: its KJT is split and routed (bucketized for row-wise) and
               the "metadata" all-to-all (sizes) is started
    forward    of batch i (its sharded collections skip their input_dist), backward, optimizer.step()

"send" and "start" run on a thread of the pipeline's own (`background_input_dist`, rectoolkit's), alongside
forward i: on a machine with a core to spare, preparing the next batches' ids (for row-wise tables, bucketing
every id) costs the step no time. Step i+1 begins by waiting for that work (an error in it, e.g. an id out
of range in batch i+2, is raised then).

Both all-to-alls run asynchronously, on a process group of the pipeline's own: none of batch i's collectives
waits behind them, and nothing blocks between an all-to-all's start and its wait one step later (the sizes are
read a step after they were sent). TorchRec sends the sizes of batch i+1 before forward i and its ids after
forward i, so its ids travel during backward i only; here the sizes go one batch earlier, so the ids have a
whole step.

The ids of a batch do not depend on the weights, so sending them one step early changes no number: the weights
after N steps are bit-identical to the plain loop's. Which KJT feeds which sharded collection is found on the
first step (that step runs plain): the collection's input must be the batch itself or one of its fields
(`batch.sparse_features`); a collection fed anything else (a KJT the model computes) keeps its input_dist
inside forward, as TorchRec's pipeline does for modules that are not "top-level". `pipelined_modules` lists
the collections whose input_dist runs ahead.

Epochs: give progress() each epoch's new iterator (`iter(dataloader)`); it is read after the batches already in
the pipeline, as in TorchRec (with execute_all_batches=False the two batches loaded ahead at the end of an epoch
train first in the next; `reset()` drops them). `detach()` hands the model back for use outside the pipeline
(evaluate or save it) with the batches in flight kept, and the next progress() re-attaches it; `attach(model)`
continues with another DistributedModelParallel.

Every rank must call progress() equally often and give it the same number of batches (the collectives pair up).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable, ContextManager, Dict, Generic, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.distributed.model_parallel import DistributedModelParallel
from rectoolkit.distributed.train_pipeline.batch_fields import FieldPath, follow, path_to
from rectoolkit.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
from rectoolkit.distributed.train_pipeline.utils import wait_for_copy

__all__ = ["EvalPipelineSparseDist", "TrainPipeline", "TrainPipelineBase", "TrainPipelineSparseDist",
           "TrainPipelineSparseDistLite"]

ModelForward = Callable[[Any], Tuple[torch.Tensor, Any]]


class TrainPipeline(Generic[In, Out]):
    """The interface: `progress(dataloader_iter)` trains on one batch and returns the model's output; it raises
    StopIteration once the batches have run out."""

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        raise NotImplementedError

    def reset(self) -> None:
        """Drop what the pipeline holds (TorchRec's: nothing here)."""

    def sync_embeddings(self, model: nn.Module, interval_batches: Optional[int],
                        context: Optional[TrainPipelineContext] = None) -> None:
        """TorchRec's: a 2D-parallel DMPCollection's replicas synced (`model.sync()`) when the context's batch index
        is a multiple of `interval_batches`; nothing for any other model, or with `interval_batches` None. The
        pipelines call it after each backward, before the optimizer step."""
        from rectoolkit.distributed.two_dimensional import DMPCollection

        if not isinstance(model, DMPCollection) or interval_batches is None:
            return
        if context is None or context.index is None:
            raise ValueError(f"{type(self).__name__}.sync_embeddings: give a context with the batch's index "
                             "(TrainPipelineContext(index=i)); it syncs every `interval_batches` batches by it")
        if context.index % interval_batches == 0:
            model.sync()


class TrainPipelineBase(TrainPipeline[In, Out]):
    """TorchRec's TrainPipelineBase: batch i+1 is loaded and copied to the device (a side stream on CUDA) while
    batch i trains; nothing else overlaps. Works for any model returning `(loss, output)`.

        >>> model = nn.Linear(2, 1)
        >>> forward = lambda batch: ((model(batch) ** 2).mean(), None)
        >>> pipeline = TrainPipelineBase(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
        ...                              custom_model_fwd=forward)
        >>> batches = iter([torch.ones(4, 2), torch.ones(4, 2)])
        >>> pipeline.progress(batches), pipeline.progress(batches)
        (None, None)
        >>> pipeline.progress(batches)
        Traceback (most recent call last):
        ...
        StopIteration
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device,
                 custom_model_fwd: Optional[ModelForward] = None, enable_inplace_copy_batch: bool = False) -> None:
        _refuse("enable_inplace_copy_batch", enable_inplace_copy_batch, False,
                "batches are copied to the device with batch.to(device, non_blocking=True)")
        self._model, self._optimizer = model, optimizer
        self._device = torch.device(device)
        self._model_fwd: ModelForward = custom_model_fwd if custom_model_fwd is not None else model
        self._memcpy_stream = torch.cuda.Stream(self._device) if self._device.type == "cuda" else None
        self._batches: List[Any] = []  # [batch i, batch i+1, ...], already on their way to the device
        self._dataloader_iter: Optional[Iterator[Any]] = None
        self._exhausted = False  # the dataloader_iter has run out
        self._batch_count = 0

    # ------------------------------------------------------------------ loading
    def _next_batch(self, dataloader_iter: Iterator[Any]) -> Optional[Any]:
        """The iterator's next batch; None once it has run out. A new iterator (the next epoch) is read from the
        start, after the batches already loaded (TorchRec's TrainPipelineSparseDist's rule)."""
        if not hasattr(dataloader_iter, "__next__"):
            raise TypeError(f"{type(self).__name__}.progress() takes an iterator, got a "
                            f"{type(dataloader_iter).__name__}; pass iter(dataloader) and keep passing the same one")
        if dataloader_iter is not self._dataloader_iter:
            self._dataloader_iter, self._exhausted = dataloader_iter, False
        if self._exhausted:
            return None
        try:
            return next(dataloader_iter)
        except StopIteration:
            self._exhausted = True
            return None

    def _enqueue_batch(self, dataloader_iter: Iterator[Any]) -> bool:
        """Load one batch and start its copy to the device; False when the iterator has run out."""
        batch = self._next_batch(dataloader_iter)
        if batch is None:
            return False
        if not hasattr(batch, "to"):
            raise TypeError(f"{type(self).__name__}: a batch must have .to(device, non_blocking) (as TorchRec's "
                            f"Batch), got a {type(batch).__name__}; wrap it, e.g. in rectoolkit.train.Batch")
        if self._memcpy_stream is None:
            self._batches.append(batch.to(self._device, non_blocking=True))
        else:
            with torch.cuda.stream(self._memcpy_stream):
                self._batches.append(batch.to(self._device, non_blocking=True))
        return True

    def _wait_for_batch(self, batch: Any) -> None:
        """On CUDA: the compute stream waits for the copy, and the copied tensors are marked as used there."""
        wait_for_copy(batch, self._memcpy_stream, self._device)

    # ------------------------------------------------------------------ one step
    def _train_step(self, batch: Any, after_forward: Callable[[], None] = lambda: None) -> Any:
        """zero_grad, forward, backward, optimizer step (zero_grad, backward and step in training mode only), the
        forward and the backward each under `_autograd_context()`; `after_forward` runs between them."""
        if self._model.training:
            self._optimizer.zero_grad()
        with self._autograd_context():
            losses, output = self._model_fwd(batch)
        after_forward()
        if self._model.training:
            with self._autograd_context():
                torch.sum(losses, dim=0).backward()
            self._after_backward()
            self._optimizer.step()
        return output

    def _after_backward(self) -> None:
        """What runs between a step's backward and its optimizer step (TrainPipelineSparseDist: sync_embeddings)."""

    def _autograd_context(self) -> ContextManager:
        """What the forward and the backward each run under: nothing here (TrainPipelineSparseDistCompAutograd:
        compiled autograd)."""
        return contextlib.nullcontext()

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Train on the next batch and return the model's output; StopIteration when there is none."""
        if not self._batches:
            self._enqueue_batch(dataloader_iter)
        if not self._batches:
            raise StopIteration
        batch = self._batches[0]
        self._wait_for_batch(batch)
        self._enqueue_batch(dataloader_iter)
        output = self._train_step(batch)
        self._batches.pop(0)
        self._batch_count += 1
        return output

    def reset(self) -> None:
        """TorchRec's reset: drop the batches loaded but not trained on and forget the iterator."""
        self._batches.clear()
        self._dataloader_iter, self._exhausted = None, False


class TrainPipelineSparseDist(TrainPipelineBase[In, Out]):
    """TorchRec's TrainPipelineSparseDist: the input_dist of batch i+1 runs while batch i trains.

    Args (TorchRec's):
        model: a DistributedModelParallel whose forward takes the batch and returns (loss, output) (or any
            forward, given as custom_model_fwd).
        optimizer: steps every parameter that is not updated in backward (e.g. a CombinedOptimizer, or the
            dense optimizer: the fused embedding optimizers update in backward anyway).
        device: where batches go and the model runs.
        execute_all_batches: True: after the dataloader runs out, train on the batches already in the pipeline
            too (every batch is trained on). False: stop as soon as the dataloader runs out, leaving the last two
            batches untrained, as TorchRec does.
        custom_model_fwd: `batch -> (loss, output)`, called instead of model(batch).
        dmp_collection_sync_interval_batches: a DMPCollection's replicas are synced (its sync()) after the backward
            of every batch whose index is a multiple of it (1: every batch, TorchRec's default); None: never. Nothing
            for any other model.
        background_input_dist (rectoolkit's): True (default): the next batches' input_dist work (split, route,
            start the all-to-alls) runs on a thread of the pipeline's own while this batch trains; False: on the
            calling thread, before this batch's forward. The numbers are the same either way.
    context_type: TorchRec's default, TrainPipelineContext (or None), only: rectoolkit's pipeline keeps its own
    record of a batch in flight, so a context class of another type would never be used (NotImplementedError).
    apply_jit, pipeline_postproc, enqueue_batch_after_forward, enable_inplace_copy_batch,
    free_features_storage_early and clear_data_dist_inputs are accepted at their defaults only (a
    NotImplementedError otherwise).

    After the first step, `pipelined_modules` names the sharded collections whose input_dist runs ahead.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, execute_all_batches: bool = True,
                 apply_jit: bool = False, context_type: Optional[type] = TrainPipelineContext,
                 pipeline_postproc: bool = False,
                 custom_model_fwd: Optional[ModelForward] = None,
                 dmp_collection_sync_interval_batches: Optional[int] = 1, enqueue_batch_after_forward: bool = False,
                 enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                 clear_data_dist_inputs: bool = False, background_input_dist: bool = True) -> None:
        _refuse("apply_jit", apply_jit, False, "the model runs eagerly")
        if context_type not in (TrainPipelineContext, None):
            raise NotImplementedError(
                f"train pipeline: context_type={getattr(context_type, '__name__', context_type)} is not supported "
                "(rectoolkit's pipeline keeps its own record of a batch in flight, not context objects); leave it at "
                "TrainPipelineContext")
        _refuse("pipeline_postproc", pipeline_postproc, False, "only sharded collections' input_dist is pipelined")
        _refuse("enqueue_batch_after_forward", enqueue_batch_after_forward, False,
                "the next batch is loaded before the forward")
        _refuse("free_features_storage_early", free_features_storage_early, False, "the batch's KJT is kept")
        _refuse("clear_data_dist_inputs", clear_data_dist_inputs, False, "the batch's KJT is kept")
        if dmp_collection_sync_interval_batches is not None and not (
                isinstance(dmp_collection_sync_interval_batches, int) and dmp_collection_sync_interval_batches > 0):
            raise ValueError(f"{type(self).__name__}(dmp_collection_sync_interval_batches="
                             f"{dmp_collection_sync_interval_batches!r}): give how many batches apart a DMPCollection's "
                             "replicas are synced (an int >= 1), or None to never sync them")
        self._sync_interval = dmp_collection_sync_interval_batches
        dmp = _dmp_of(model)
        super().__init__(model, optimizer, device, custom_model_fwd, enable_inplace_copy_batch)
        self._custom_model_fwd = custom_model_fwd
        self._execute_all_batches = execute_all_batches
        self._sharded = dmp.sharded_modules
        self._env, self._ahead_env = dmp.env, _ahead_env(dmp.env)
        self._input_paths: Optional[Dict[str, FieldPath]] = None  # found on the first step
        self._fed_elsewhere: List[str] = []  # sharded collections fed something else: not pipelined
        # subclasses with TorchRec's default pipeline_postproc=True set it: such collections are then refused
        self._pipeline_postproc = False
        self._ahead: List[Dict[str, Any]] = []  # per batch in self._batches: path -> InputDistAhead
        self._attached = True
        # one worker: the ahead collectives are started in one order, the same on every rank
        self._worker = _WorkerThread("rectoolkit-input-dist") if background_input_dist else None
        self._work_in_flight: Optional[Future] = None

    @property
    def pipelined_modules(self) -> List[str]:
        """Paths (in the DMP) of the sharded collections whose input_dist runs one batch ahead."""
        return sorted(self._input_paths or {})

    # ------------------------------------------------------------------ input_dist ahead
    def _start_input_dist(self, batch: Any, into: Dict[str, Any]) -> None:
        """Start the input_dist of `batch` (its first stage) for every pipelined collection, in one fixed order,
        noting each in `into` (the batch's entry of self._ahead)."""
        self._wait_for_batch(batch)  # its ids must be on the device before they are sent
        for path, field_path in sorted(self._input_paths.items()):
            into[path] = self._sharded[path].start_input_dist(follow(batch, field_path), self._ahead_env)

    def _work_ahead(self, sizes_arrived: Dict[str, Any], later: Optional[Tuple[Any, Dict[str, Any]]]) -> None:
        """Start the ids of the batch whose sizes have arrived (batch i+1: sent during step i-1), then the first
        stage of the input_dist of `later` (batch i+2, with its self._ahead entry), if any."""
        for ahead in sizes_arrived.values():
            ahead.send()
        if later is not None:
            self._start_input_dist(*later)

    def _start_work_ahead(self) -> None:
        """_work_ahead for this step, on the pipeline's thread (or here); joined at the start of the next step."""
        work = (self._ahead[1] if len(self._batches) > 1 else {},
                (self._batches[2], self._ahead[2]) if len(self._batches) > 2 else None)
        if self._worker is None:
            self._work_ahead(*work)
        else:
            self._work_in_flight = self._worker.submit(self._work_ahead, *work)

    def _join_work_ahead(self) -> None:
        """Wait for the work ahead started last step (raising its error, e.g. an id out of range in a later batch)."""
        work, self._work_in_flight = self._work_in_flight, None
        if work is not None:
            work.result()

    def _find_input_paths(self, batch: Any) -> Any:
        """Run the first step plain, noting which field of the batch each sharded collection receives; the input_dist
        of the next batch starts once they are known (after this forward)."""
        received: Dict[str, Any] = {}
        hooks = [module.register_forward_pre_hook(
            lambda module, args, path=path: received.setdefault(path, args[0] if args else None))
            for path, module in self._sharded.items()]

        def after_forward() -> None:
            for hook in hooks:
                hook.remove()
            self._input_paths = {path: field_path for path, features in received.items()
                                 if (field_path := path_to(batch, features)) is not None}
            self._fed_elsewhere = sorted(set(received) - set(self._input_paths))
            if self._pipeline_postproc and self._fed_elsewhere:
                raise NotImplementedError(
                    f"{type(self).__name__}(pipeline_postproc=True): the sharded collections {self._fed_elsewhere} are "
                    "fed a KJT the model computes, not a field of the batch; rectoolkit does not pipeline the modules "
                    "that compute it (TorchRec's postprocs); pass pipeline_postproc=False to run those collections "
                    "inside the forward, as TorchRec does then, or feed them a field of the batch")
            for later, into in zip(self._batches[1:], self._ahead[1:]):  # the sizes of batches 1 and 2
                self._start_input_dist(later, into)
            self._work_ahead(self._ahead[1] if len(self._ahead) > 1 else {}, None)  # the ids of batch 1

        try:
            return self._train_step(batch, after_forward)
        finally:
            for hook in hooks:
                hook.remove()

    def _enqueue(self, dataloader_iter: Iterator[Any]) -> bool:
        loaded = self._enqueue_batch(dataloader_iter)
        if loaded:
            self._ahead.append({})
        return loaded

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Train on batch i and return the model's output; StopIteration once every batch has been trained on
        (execute_all_batches=False: once the dataloader has run out; the two batches loaded ahead then stay in
        the pipeline and train first when progress() is given the next iterator, as in TorchRec)."""
        if not self._attached:
            self.attach()
        while len(self._batches) < 2 and self._enqueue(dataloader_iter):
            pass  # fill: batch i and batch i+1
        if not self._batches:
            raise StopIteration
        batch = self._batches[0]
        self._wait_for_batch(batch)
        self._join_work_ahead()
        if self._input_paths is not None:  # batches loaded after the pipeline ran dry (a new epoch): start them
            for later, into in zip(self._batches, self._ahead):
                if not into:
                    self._start_input_dist(later, into)
        for ahead in self._ahead[0].values():
            ahead.wait()
        if not self._enqueue(dataloader_iter) and not self._execute_all_batches:
            self._complete_in_flight()
            raise StopIteration
        for path, ahead in self._ahead[0].items():
            self._sharded[path].use_input_dist(ahead)
        if self._input_paths is None:
            output = self._find_input_paths(batch)
        else:
            self._before_work_ahead()
            self._start_work_ahead()  # the ids of batch i+1 and the sizes of batch i+2 travel during step i
            output = self._train_step(batch)
        self._batches.pop(0)
        self._ahead.pop(0)
        self._batch_count += 1
        return output

    def _after_backward(self) -> None:
        self.sync_embeddings(self._model, self._sync_interval, TrainPipelineContext(index=self._batch_count))

    def _before_work_ahead(self) -> None:
        """What a subclass runs in a pipelined step before the work ahead starts (TrainPipelineFusedSparseDist:
        the lookup of batch i)."""

    def finish(self) -> None:
        """Stop here: wait for the input_dists in flight and drop the batches not trained on. For a loop that
        stops before the dataloader runs out (every rank at the same step: the peers have the same in flight)."""
        self._complete_in_flight()
        self._batches.clear()
        self._ahead.clear()

    def reset(self) -> None:
        """TorchRec's reset: `finish()`, and forget the iterator (the next one given is read from its start)."""
        self.finish()
        super().reset()

    def detach(self) -> nn.Module:
        """TorchRec's detach: the model, to use outside the pipeline (evaluate it, save it, call it on other
        batches). The batches loaded ahead stay in the pipeline with their input_dists; the next progress()
        re-attaches by itself and goes on where it stopped. Every rank must detach at the same step."""
        self._join_work_ahead()  # nothing of the pipeline's runs on the model while it is out
        self._attached = False
        return self._model

    def attach(self, model: Optional[nn.Module] = None, sparse_dist: bool = True) -> None:
        """TorchRec's attach: use the pipeline again after `detach()`, with `model` (another
        DistributedModelParallel, e.g. reloaded from a checkpoint) or the model it had. For another model, the
        input_dists started for the old one are completed and dropped, and the next step runs plain (it finds
        which field of the batch feeds each sharded collection), as the first step does. `sparse_dist` is
        TorchRec's choice of restarting the current batch's input_dist at once; here a new model's next step
        always does its own, so True and False give the same steps. Every rank must attach at the same step."""
        if not isinstance(sparse_dist, bool):
            raise TypeError(f"attach(sparse_dist={sparse_dist!r}): give True or False")
        if model is not None and model is not self._model:
            dmp = _dmp_of(model)
            self._complete_in_flight()
            self._ahead = [{} for _ in self._batches]
            self._model, self._sharded, self._input_paths = model, dmp.sharded_modules, None
            self._model_fwd = self._custom_model_fwd if self._custom_model_fwd is not None else model
            if dmp.env.pg is not self._env.pg:
                self._env, self._ahead_env = dmp.env, _ahead_env(dmp.env)
        self._attached = True

    def _complete_in_flight(self) -> None:
        """Wait for the work ahead and every input_dist in flight, keeping their results (all ranks complete the
        same ones in the same order, so nothing is left pending on the pipeline's group)."""
        self._join_work_ahead()
        for started in self._ahead:
            for ahead in started.values():
                ahead.wait()


class TrainPipelineSparseDistLite(TrainPipelineSparseDist[In, Out]):
    """TorchRec's TrainPipelineSparseDistLite: one batch in flight. Batch i+1 is loaded and copied to the device
    (a side stream on CUDA) while batch i trains; batch i's input_dist runs in its own forward, in the critical
    path (no input_dist ahead, so no batch's ids or sizes are held for the next steps: the memory of one batch).
    Every batch is trained on (TorchRec's execute_all_batches), StopIteration at the end; the numbers are the plain
    loop's. `pipelined_modules` is empty: nothing runs ahead.

    Args (TorchRec's): model, optimizer, device, custom_model_fwd; apply_jit, context_type, pipeline_postproc,
    enable_inplace_copy_batch, free_features_storage_early and clear_data_dist_inputs at their defaults only, as in
    TrainPipelineSparseDist.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, apply_jit: bool = False,
                 context_type: Optional[type] = TrainPipelineContext, pipeline_postproc: bool = False,
                 custom_model_fwd: Optional[ModelForward] = None, enable_inplace_copy_batch: bool = False,
                 free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False) -> None:
        super().__init__(model, optimizer, device, execute_all_batches=True, apply_jit=apply_jit,
                         context_type=context_type, pipeline_postproc=pipeline_postproc,
                         custom_model_fwd=custom_model_fwd, enable_inplace_copy_batch=enable_inplace_copy_batch,
                         free_features_storage_early=free_features_storage_early,
                         clear_data_dist_inputs=clear_data_dist_inputs, background_input_dist=False)

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Train on batch i (its input_dist in its forward) while batch i+1 is loaded; its output."""
        if not self._attached:
            self.attach()
        return TrainPipelineBase.progress(self, dataloader_iter)


class EvalPipelineSparseDist(TrainPipelineSparseDist[In, Out]):
    """TorchRec's EvalPipelineSparseDist: the same pipeline for evaluation. Each `progress()` runs the forward of
    batch i (the model returns `(loss, output)`; `output` is returned) while the input_dist of the next batches
    runs ahead; no backward, no optimizer step, every batch evaluated (execute_all_batches), StopIteration at the
    end. Put the model in eval mode for layers that differ there (dropout, batch norm); the weights are not changed
    either way.

    Args (TorchRec's): model, optimizer (kept, not stepped), device; apply_jit, pipeline_postproc,
    enable_inplace_copy_batch, free_features_storage_early and clear_data_dist_inputs at their defaults only, as
    in TrainPipelineSparseDist.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, apply_jit: bool = False,
                 pipeline_postproc: bool = False, enable_inplace_copy_batch: bool = False,
                 free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False) -> None:
        super().__init__(model, optimizer, device, execute_all_batches=True, apply_jit=apply_jit,
                         pipeline_postproc=pipeline_postproc, enable_inplace_copy_batch=enable_inplace_copy_batch,
                         free_features_storage_early=free_features_storage_early,
                         clear_data_dist_inputs=clear_data_dist_inputs)

    def _train_step(self, batch: Any, after_forward: Callable[[], None] = lambda: None) -> Any:
        """Forward only (no gradients are kept: nothing steps)."""
        with torch.no_grad():
            _, output = self._model_fwd(batch)
        after_forward()
        return output


# ------------------------------------------------------------------------------------------------ helpers
class _WorkerThread:
    """One thread that runs what is submitted, in order. A daemon: a rank whose training fails exits without
    waiting for it, even while it waits on a collective its dead peers will never join; it ends when its owner
    is garbage collected."""

    def __init__(self, name: str) -> None:
        self._tasks: "queue.SimpleQueue" = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self._tasks,), name=name, daemon=True).start()
        weakref.finalize(self, self._tasks.put, None)

    def submit(self, function: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        self._tasks.put((future, function, args))
        return future


def _serve(tasks: "queue.SimpleQueue") -> None:
    while (task := tasks.get()) is not None:
        future, function, args = task
        try:
            future.set_result(function(*args))
        except BaseException as error:  # handed to the training thread, which raises it
            future.set_exception(error)
        del task, future, function, args  # hold nothing of the owner while waiting for the next task


def _dmp_of(model: nn.Module) -> DistributedModelParallel:
    dmp = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if not isinstance(dmp, DistributedModelParallel):
        raise ValueError(f"TrainPipelineSparseDist: the model is a {type(model).__name__}, not a "
                         "DistributedModelParallel, so it has no sharded input_dist to pipeline; wrap it "
                         "(DistributedModelParallel(model, plan=...)) or use TrainPipelineBase")
    return dmp


def _ahead_env(env: Any) -> Any:
    """The env the input_dists ahead run on: a process group of their own (over the same ranks), so that they
    never queue behind a step's collectives."""
    if env.world_size == 1:
        return env
    ranks = dist.get_process_group_ranks(env.pg) if env.pg is not None else list(range(env.world_size))
    mesh = getattr(env, "device_mesh", None)
    if mesh is not None:  # a DMPCollection's sharding group: every rank makes every group's (rows of the 2D mesh)
        groups = [dist.new_group(ranks=row, backend=dist.get_backend(env.pg)) for row in mesh.mesh.tolist()]
        return env.with_group(groups[[ranks == row for row in mesh.mesh.tolist()].index(True)])
    if len(ranks) < dist.get_world_size():
        raise NotImplementedError(
            f"TrainPipelineSparseDist on a process group of part of the world (ranks {ranks} of "
            f"{dist.get_world_size()}): its input_dists ahead need a group of their own, which those ranks alone would "
            "have to make, and torch allows that once per set of ranks (DistributedModelParallel's dense part takes "
            "it); train on the whole world, or without the pipeline (TrainPipelineBase or a plain loop)")
    return env.with_group(dist.new_group(ranks=ranks, backend=dist.get_backend(env.pg)))


def _refuse(name: str, value: Any, default: Any, why: str) -> None:
    if value != default:
        raise NotImplementedError(f"train pipeline: {name}={value!r} is not supported ({why}); leave it at "
                                  f"{default!r}")
