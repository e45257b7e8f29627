"""TorchRec's TrainPipelineSemiSync: the embeddings of batch i+1 are looked up before batch i's backward.

Step i (from batch `start_batch` on; the steps before run as TrainPipelineSparseDist's, whose numbers are the
plain loop's):

    forward    batch i, on the embeddings looked up during step i-1 (detached: its backward stops at them)
    look up    batch i+1: lookup and output_dist on the tables as they are now, before batch i updates them
    backward   of batch i's loss (the dense part), then from batch i's embeddings into the tables
               ("embedding backward": the fused optimizers update the tables here)
    step       the optimizer, then zero_grad

So batch i+1 is computed on tables one update old (they miss batch i's), and its lookup and output_dist can run
while batch i's backward does (here they run before it, on the training thread; on GPUs TorchRec overlaps them).
Its gradient is then applied to the tables as they are after batch i's update. The results differ from the plain
loop's by design; they equal TorchRec 1.8's TrainPipelineSemiSync on the same model, weights and batches
(tests/distributed/test_train_pipeline_semi_sync.py runs both).

`stash_gradients=True` makes the dense part one step stale too: the optimizer steps with the gradients of the
batch before (the step at `start_batch` is skipped: there is none). The input_dist of the batches ahead runs as
in TrainPipelineSparseDist (ids on a process group of the pipeline's own, on the pipeline's thread).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from rectoolkit.distributed.train_pipeline.pipeline_context import In, Out
from rectoolkit.distributed.train_pipeline.sparse_dist import ModelForward, TrainPipelineSparseDist
from rectoolkit.sparse import JaggedTensor, KeyedTensor

__all__ = ["TrainPipelineSemiSync"]

# path of a sharded collection -> (its input KJT, the looked-up tensors with their graph, detached copies of them,
# the output rebuilt on the copies: what the forward gets) for one batch
LookedUp = Dict[str, Tuple[Any, List[torch.Tensor], List[torch.Tensor], Any]]


class TrainPipelineSemiSync(TrainPipelineSparseDist[In, Out]):
    """TorchRec's TrainPipelineSemiSync (torchrec.distributed.train_pipeline.train_pipelines): from batch
    `start_batch` on, the embeddings of batch i+1 are looked up on the tables before batch i updates them.

    Args (TorchRec's):
        model, optimizer, device, custom_model_fwd, dmp_collection_sync_interval_batches: as in
            TrainPipelineSparseDist. The optimizer should step the dense parameters only (e.g.
            KeyedOptimizerWrapper over in_backward_optimizer_filter(model.named_parameters())): the tables are
            updated in the embedding backward.
        execute_all_batches: every batch is trained on either way: with False TorchRec 1.8's semi-sync pipeline
            keeps training on the batches it holds after the dataloader runs out, and so does this one.
        start_batch: the first batch whose next batch is looked up early (TorchRec's default 900: the batches
            before train as the plain loop does).
        stash_gradients: True: from start_batch on, the optimizer steps with the previous batch's gradients.
        strict: True: an optimizer that holds parameters of the pipelined collections is an error (TorchRec:
            an Exception); False: a warning.
        background_input_dist (rectoolkit's): as in TrainPipelineSparseDist.
        pipeline_postproc: True (TorchRec's default) asks that collections fed a KJT the model computes be
            pipelined too; rectoolkit does not, so True is refused (NotImplementedError, on the first step) for a
            model with such a collection. False: those run inside the forward, not semi-sync, as in TorchRec.
    apply_jit, enable_inplace_copy_batch, free_features_storage_early and clear_data_dist_inputs are accepted at
    their defaults only (a NotImplementedError otherwise).

    An embedding output that gets no gradient (unused by the loss) is left out of the embedding backward, as
    TorchRec leaves it out (TorchRec back-propagates a one-element output even then; this pipeline does not).
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, execute_all_batches: bool = True,
                 apply_jit: bool = False, start_batch: int = 900, stash_gradients: bool = False,
                 pipeline_postproc: bool = True, custom_model_fwd: Optional[ModelForward] = None,
                 strict: bool = False, dmp_collection_sync_interval_batches: Optional[int] = 1,
                 enable_inplace_copy_batch: bool = False, free_features_storage_early: bool = False,
                 clear_data_dist_inputs: bool = False, background_input_dist: bool = True) -> None:
        if not isinstance(start_batch, int) or start_batch < 0:
            raise ValueError(f"TrainPipelineSemiSync(start_batch={start_batch!r}): give the index (>= 0) of the first "
                             "batch whose next batch is looked up early (0: from the start)")
        super().__init__(model, optimizer, device, execute_all_batches=True, apply_jit=apply_jit,
                         custom_model_fwd=custom_model_fwd,
                         dmp_collection_sync_interval_batches=dmp_collection_sync_interval_batches,
                         enable_inplace_copy_batch=enable_inplace_copy_batch,
                         free_features_storage_early=free_features_storage_early,
                         clear_data_dist_inputs=clear_data_dist_inputs, background_input_dist=background_input_dist)
        self._start_batch, self._stash_gradients, self._strict = start_batch, stash_gradients, strict
        self._gradients: Dict[str, torch.Tensor] = {}  # stash_gradients: the previous batch's, by parameter name
        self._looked_up_ahead: Optional[Tuple[Any, LookedUp]] = None  # (batch i+1, its embeddings)
        self._optimizer_checked = False
        self._pipeline_postproc = bool(pipeline_postproc)

    def is_semi_sync(self) -> bool:
        """TorchRec's: whether the next progress() looks its next batch up early (its batch index >= start_batch)."""
        return bool(self._batches) and self._batch_count >= self._start_batch

    # ------------------------------------------------------------------ one step
    def _train_step(self, batch: Any, after_forward: Callable[[], None] = lambda: None) -> Any:
        index = self._batch_count
        semi_sync = index >= self._start_batch
        looked_up = self._embeddings_of(batch)
        for path, (features, _, _, output) in looked_up.items():
            self._sharded[path].use_output(features, output)
        losses, output = self._model_fwd(batch)
        after_forward()
        if not self._optimizer_checked and self._input_paths is not None:
            self._check_optimizer()
        if semi_sync and len(self._batches) > 1 and self._input_paths:
            self._join_work_ahead()  # the ids of batch i+1 were sent on the pipeline's thread
            self._looked_up_ahead = (self._batches[1], self._look_up(self._ahead[1]))
        if self._model.training:
            torch.sum(losses, dim=0).backward()
            _embedding_backward(looked_up)
            self._after_backward()
            if semi_sync and self._stash_gradients:
                self._grad_swap()
            if not (index == self._start_batch and self._stash_gradients):  # nothing stashed yet: TorchRec skips
                self._optimizer.step()
            self._optimizer.zero_grad()
        return output

    def _embeddings_of(self, batch: Any) -> LookedUp:
        """Batch i's embeddings: looked up during step i-1 (semi-sync), else now (on the updated tables); none on
        the first step, which runs plain."""
        ahead, self._looked_up_ahead = self._looked_up_ahead, None
        if ahead is not None and ahead[0] is batch:
            return ahead[1]
        if self._input_paths is None:
            return {}
        return self._look_up(self._ahead[0])

    def _look_up(self, started: Dict[str, Any]) -> LookedUp:
        """Lookup and output_dist of one batch for every pipelined collection (its input_dist, started ahead, is
        waited for), in one fixed order on every rank; the outputs are detached for the forward."""
        looked_up: LookedUp = {}
        for path, input_dist in sorted(started.items()):
            module = self._sharded[path]
            module.use_input_dist(input_dist)
            looked_up[path] = (input_dist.features, *_detached(module, module(input_dist.features).wait()))
        return looked_up

    def _grad_swap(self) -> None:
        """TorchRec's: each parameter's gradient is stashed and the one stashed last step takes its place."""
        for name, param in self._model.named_parameters():
            stashed = self._gradients.get(name)
            if param.grad is not None:
                self._gradients[name] = param.grad.clone()
            param.grad = stashed

    def _check_optimizer(self) -> None:
        """TorchRec's check: the optimizer holds no parameter of the pipelined collections (a warning; an error
        with strict=True)."""
        self._optimizer_checked = True
        pipelined = {id(p) for path in self._input_paths for p in self._sharded[path].parameters()}
        shared = [path for path in sorted(self._input_paths)
                  if any(id(p) in pipelined for group in getattr(self._optimizer, "param_groups", [])
                         for p in group["params"])]
        if shared:
            message = (f"TrainPipelineSemiSync: the optimizer holds parameters of the pipelined collections "
                       f"{shared}; their tables are updated in the embedding backward, so give the optimizer the dense "
                       "parameters only (in_backward_optimizer_filter(model.named_parameters()))")
            if self._strict:
                raise ValueError(message)
            warnings.warn(message, stacklevel=3)

    # ------------------------------------------------------------------ the batches held
    def finish(self) -> None:
        self._looked_up_ahead = None
        super().finish()

    def attach(self, model: Optional[nn.Module] = None, sparse_dist: bool = True) -> None:
        if model is not None and model is not self._model:
            self._looked_up_ahead, self._optimizer_checked = None, False  # looked up on the old model's tables
        super().attach(model, sparse_dist)


def _detached(module: nn.Module, output: Any) -> Tuple[List[torch.Tensor], List[torch.Tensor], Any]:
    """The output's tensors (with their graph), detached copies of them (leaves that collect the forward's
    gradient), and the output rebuilt on the copies."""
    if isinstance(output, KeyedTensor):
        values = output.values()
        leaf = values.detach().requires_grad_(values.requires_grad)
        return [values], [leaf], KeyedTensor(keys=output.keys(), length_per_key=output.length_per_key(),
                                             values=leaf, key_dim=output.key_dim())
    if isinstance(output, dict) and all(isinstance(jt, JaggedTensor) for jt in output.values()):
        tensors = [jt.values() for jt in output.values()]
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
        rebuilt = {name: JaggedTensor(values=leaf, lengths=jt.lengths(), weights=jt.weights_or_none())
                   for (name, jt), leaf in zip(output.items(), leaves)}
        return tensors, leaves, rebuilt
    raise TypeError(f"TrainPipelineSemiSync: {type(module).__name__} returned a {type(output).__name__}; the semi-sync "
                    "pipeline takes sharded EmbeddingBagCollections (KeyedTensor) and EmbeddingCollections "
                    "({feature: JaggedTensor})")


def _embedding_backward(looked_up: LookedUp) -> None:
    """From the embeddings the forward used back into the tables, with the gradients the forward left on the
    detached copies (the fused optimizers update the tables here)."""
    tensors, grads = [], []
    for _, originals, leaves, _ in looked_up.values():
        for original, leaf in zip(originals, leaves):
            if leaf.grad is not None:
                tensors.append(original)
                grads.append(leaf.grad)
    if tensors:
        torch.autograd.backward(tensors, grads)
