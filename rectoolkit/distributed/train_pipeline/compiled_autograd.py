"""TorchRec's TrainPipelineSparseDistCompAutograd: TrainPipelineSparseDist with every backward run under compiled
autograd (torch._dynamo.compiled_autograd): the autograd graph of the step, the sharded collections' backward
included, is traced and compiled with `torch.compile(**compiled_autograd_options)`; the first step's backward too,
as in TorchRec (only the very first forward runs outside the context, which does not act on forwards anyway).

The options come from the `compiled_autograd_options` argument (rectoolkit's), else from the model's
`_compiled_autograd_options` attribute (TorchRec's way to set them), else the default: backend "inductor",
dynamic=True and fullgraph=False. TorchRec's default has fullgraph=True: rectoolkit's sharded backward holds
collectives on gloo process groups and checks on the gradients (finite values) that dynamo cannot trace into one
graph, so it compiles in pieces; fullgraph=True is refused with the place where the graph breaks.

A model holding a DistributedDataParallel (the DMP's dense part, with more than one rank) must have been built
with `torch._dynamo.config.optimize_ddp = "python_reducer"`: compiled autograd cannot run DDP's C++ reducer, and
DDP chooses its reducer when built, so the pipeline refuses a DDP built without it (ValueError naming the fix;
TorchRec's fails in the first backward). TorchRec's constructor sets global settings for its inductor graphs
(compute/communication overlap of NCCL collectives inside the compiled graph); rectoolkit's collectives stay
outside the graphs, and it sets none.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Mapping, Optional, Union

import torch
from torch import nn

from rectoolkit.distributed.train_pipeline.pipeline_context import In, Out, TrainPipelineContext
from rectoolkit.distributed.train_pipeline.sparse_dist import ModelForward, TrainPipelineSparseDist

__all__ = ["TrainPipelineSparseDistCompAutograd"]

DEFAULT_OPTIONS: Dict[str, Union[str, bool]] = {"backend": "inductor", "dynamic": True, "fullgraph": False}


class TrainPipelineSparseDistCompAutograd(TrainPipelineSparseDist[In, Out]):
    """TorchRec's TrainPipelineSparseDistCompAutograd (see the module docstring): the same steps and numbers as
    TrainPipelineSparseDist, each backward compiled (the numbers to rounding: a compiled backward may sum a gradient's
    parts in another order; tested with the "eager" backend on 1 and 2 ranks).

    Args (TorchRec's): model, optimizer, device, execute_all_batches, apply_jit, context_type, pipeline_postproc,
        custom_model_fwd, free_features_storage_early, clear_data_dist_inputs, as in TrainPipelineSparseDist.
        compiled_autograd_options (rectoolkit's): keyword arguments of torch.compile for the backward (default:
            the model's `_compiled_autograd_options`, else backend "inductor", dynamic=True, fullgraph=False).
        background_input_dist (rectoolkit's): as in TrainPipelineSparseDist.
    """

    def __init__(self, model: nn.Module, optimizer: Any, device: torch.device, execute_all_batches: bool = True,
                 apply_jit: bool = False, context_type: Optional[type] = TrainPipelineContext,
                 pipeline_postproc: bool = False, custom_model_fwd: Optional[ModelForward] = None,
                 free_features_storage_early: bool = False, clear_data_dist_inputs: bool = False,
                 compiled_autograd_options: Optional[Mapping[str, Any]] = None,
                 background_input_dist: bool = True) -> None:
        options = compiled_autograd_options
        if options is None:
            options = getattr(model, "_compiled_autograd_options", DEFAULT_OPTIONS)
        if not isinstance(options, Mapping):
            raise TypeError(f"TrainPipelineSparseDistCompAutograd: compiled_autograd_options must be a dict of "
                            f"torch.compile keyword arguments, got {type(options).__name__}")
        self.compiled_autograd_options: Dict[str, Any] = dict(options)
        unknown = sorted(set(self.compiled_autograd_options) - {"backend", "dynamic", "fullgraph", "mode", "options"})
        if unknown:
            raise TypeError(f"TrainPipelineSparseDistCompAutograd: compiled_autograd_options {unknown} are not "
                            "torch.compile keyword arguments (backend, dynamic, fullgraph, mode, options)")
        if self.compiled_autograd_options.get("fullgraph"):
            raise NotImplementedError(
                "TrainPipelineSparseDistCompAutograd: compiled_autograd_options fullgraph=True: rectoolkit's sharded "
                "backward runs gloo collectives and gradient checks that break the graph (the first break: the "
                "finite-gradient check of the embedding lookup's backward, rectoolkit/modules/layout.py); give "
                "fullgraph=False (the default here)")
        torch._dynamo.lookup_backend(self.compiled_autograd_options.get("backend", "inductor"))  # a bad name fails now
        cpp_reducers = [name or "(the model)" for name, m in model.named_modules()
                        if isinstance(m, nn.parallel.DistributedDataParallel) and not m._use_python_reducer]
        if cpp_reducers:
            raise ValueError(
                f"TrainPipelineSparseDistCompAutograd: the DistributedDataParallel at {cpp_reducers[0]} runs DDP's C++ "
                "reducer, which compiled autograd cannot run; set torch._dynamo.config.optimize_ddp = "
                "\"python_reducer\" before building the DistributedModelParallel (DDP chooses its reducer when built)")
        super().__init__(model, optimizer, device, execute_all_batches=execute_all_batches, apply_jit=apply_jit,
                         context_type=context_type, pipeline_postproc=pipeline_postproc,
                         custom_model_fwd=custom_model_fwd, free_features_storage_early=free_features_storage_early,
                         clear_data_dist_inputs=clear_data_dist_inputs, background_input_dist=background_input_dist)
        self.initialized = False

    def get_compiled_autograd_ctx(self) -> ContextManager:
        """TorchRec's: nothing on the first call (the first forward), compiled autograd on every later one."""
        if not self.initialized:
            self.initialized = True
            return contextlib.nullcontext()
        return torch._dynamo.compiled_autograd._enable(torch.compile(**self.compiled_autograd_options))

    def _autograd_context(self) -> ContextManager:
        return self.get_compiled_autograd_ctx()
