"""TorchRec's TrainPipelinePT2 and TorchCompileConfig (torchrec.distributed.train_pipeline.train_pipelines): the plain
training loop, one batch per `progress()`, with the model compiled by torch.compile (PT2) from a given step on.

Step i (TorchRec's order): read batch i, copy it to the device (blocking), apply `input_transformer`, zero_grad;
at step `compile_on_iter`: `pre_compile_fn(model)`, `model.compile(fullgraph, dynamic, backend)` (in place: the
model stays compiled after the pipeline), `post_compile_fn(model)`; forward `model(batch) -> (losses, output)`,
backward of `losses` summed, optimizer step (in training mode only); return `output`. Nothing overlaps: no
batch is loaded ahead, so the pipeline holds nothing between steps.

The compiled model computes what the eager one does (inductor may reorder float sums, so its weights agree to
rounding; the "eager" and "aot_eager" backends give the eager numbers bit for bit).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import nn

from rectoolkit.distributed.train_pipeline.pipeline_context import In, Out
from rectoolkit.distributed.train_pipeline.sparse_dist import TrainPipelineBase

__all__ = ["TorchCompileConfig", "TrainPipelinePT2"]


@dataclasses.dataclass
class TorchCompileConfig:
    """TorchRec's TorchCompileConfig: how TrainPipelinePT2 compiles the model.

        >>> TorchCompileConfig(backend="aot_eager", compile_on_iter=0)
        TorchCompileConfig(fullgraph=False, dynamic=None, backend='aot_eager', compile_on_iter=0)

    Fields (TorchRec's):
        fullgraph: torch.compile's fullgraph (a graph break is an error).
        dynamic: torch.compile's dynamic (None: dynamic shapes where a size was seen to change).
        backend: a torch.compile backend: "inductor" (a C++ compiler on CPU), "aot_eager", "eager", ... or a
            backend function.
        compile_on_iter: the step (counted from 0) whose forward is the first compiled one; the steps before run
            eagerly (e.g. to profile them). A step that never comes (e.g. -1) leaves the model eager.
    """

    fullgraph: bool = False
    dynamic: Optional[bool] = None
    backend: Union[str, Callable[..., Any]] = "inductor"
    compile_on_iter: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.fullgraph, bool):
            raise TypeError(f"TorchCompileConfig: fullgraph must be True or False, got {self.fullgraph!r}")
        if self.dynamic not in (None, True, False):
            raise TypeError(f"TorchCompileConfig: dynamic must be None, True or False, got {self.dynamic!r}")
        if not (isinstance(self.backend, str) or callable(self.backend)):
            raise TypeError(f"TorchCompileConfig: backend must be a backend name (e.g. 'inductor', 'aot_eager') or "
                            f"a backend function, got {self.backend!r}")
        if isinstance(self.compile_on_iter, bool) or not isinstance(self.compile_on_iter, int):
            raise TypeError(f"TorchCompileConfig: compile_on_iter must be a step number, got {self.compile_on_iter!r}")


class TrainPipelinePT2(TrainPipelineBase[In, Out]):
    """TorchRec's TrainPipelinePT2 (see the module docstring): the model compiled with torch.compile at step
    `compile_configs.compile_on_iter`.

        >>> class Regression(nn.Module):   # returns (losses, output), as TorchRec's models do
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.linear = nn.Linear(2, 1)
        ...     def forward(self, batch):
        ...         return (self.linear(batch) ** 2).mean(), None
        >>> model = Regression()
        >>> pipeline = TrainPipelinePT2(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
        ...                             TorchCompileConfig(backend="eager", compile_on_iter=1))
        >>> batches = iter([torch.ones(4, 2)] * 2)
        >>> pipeline.progress(batches), pipeline.progress(batches)   # step 1 runs compiled
        (None, None)
        >>> pipeline.progress(batches)
        Traceback (most recent call last):
        ...
        StopIteration
        >>> torch._dynamo.reset()   # forget the compiled code (doctest's namespace is about to go)

    Args (TorchRec's):
        model: returns `(losses, output)` for a batch.
        optimizer: stepped after each backward.
        device: where each batch is copied (`batch.to(device, non_blocking=False)`).
        compile_configs: a TorchCompileConfig (default: TorchCompileConfig(), inductor at step 3). Its backend
            is looked up here, so a misspelt one fails now rather than at the compile step.
        pre_compile_fn, post_compile_fn: called with the model just before and after it is compiled.
        input_transformer: applied to each batch on the device before the forward. Default: none. (TorchRec's
            default rebuilds the TorchRec KJTs in the batch's `id_list_features` / `id_score_list_features` with
            dynamic-size hints for its tracer; rectoolkit's KeyedJaggedTensor needs no rebuilding, and dynamo
            makes the number of ids dynamic once it has seen it change.)
    While the model runs, dynamo captures `.item()` and data-dependent output shapes in the graph
    (`capture_scalar_outputs`, `capture_dynamic_output_shape_ops`), the settings TorchRec turns on for good at the
    compile step; here they hold for the pipeline's forwards only.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device,
                 compile_configs: Optional[TorchCompileConfig] = None,
                 pre_compile_fn: Optional[Callable[[nn.Module], None]] = None,
                 post_compile_fn: Optional[Callable[[nn.Module], None]] = None,
                 input_transformer: Optional[Callable[[In], In]] = None) -> None:
        if compile_configs is not None and not isinstance(compile_configs, TorchCompileConfig):
            raise TypeError(f"TrainPipelinePT2: compile_configs must be a TorchCompileConfig, got a "
                            f"{type(compile_configs).__name__}")
        super().__init__(model, optimizer, device)
        self._compile_configs = compile_configs if compile_configs is not None else TorchCompileConfig()
        if isinstance(self._compile_configs.backend, str):
            from torch._dynamo.backends.registry import lookup_backend  # imports dynamo (seconds): not at import

            lookup_backend(self._compile_configs.backend)  # InvalidBackend, naming the list of backends
        self._pre_compile_fn, self._post_compile_fn = pre_compile_fn, post_compile_fn
        self._input_transformer = input_transformer
        self._iter = 0

    def progress(self, dataloader_iter: Iterator[In]) -> Out:
        """Train on the next batch (compiling the model first at step compile_on_iter) and return the model's
        output; StopIteration when the iterator has run out."""
        batch = next(dataloader_iter)
        if not hasattr(batch, "to"):
            raise TypeError(f"TrainPipelinePT2: a batch must have .to(device, non_blocking) (as TorchRec's Batch), "
                            f"got a {type(batch).__name__}")
        batch = batch.to(self._device, non_blocking=False)
        if self._input_transformer is not None:
            batch = self._input_transformer(batch)
        if self._model.training:
            self._optimizer.zero_grad()
        if self._iter == self._compile_configs.compile_on_iter:
            self._compile()
        with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
            losses, output = self._model(batch)
        self._iter += 1
        if self._model.training:
            torch.sum(losses).backward()
            self._optimizer.step()
        return output

    def _compile(self) -> None:
        config = self._compile_configs
        if self._pre_compile_fn is not None:
            self._pre_compile_fn(self._model)
        self._model.compile(fullgraph=config.fullgraph, dynamic=config.dynamic, backend=config.backend)
        if self._post_compile_fn is not None:
            self._post_compile_fn(self._model)
