"""TorchRec's gradient accumulation (torchrec.distributed.train_pipeline.gradient_accumulation): a wrapper around
any train pipeline that steps its optimizer once every `num_steps` batches (micro-batches).

What one `progress()` call does, as TorchRec 1.8's:
- the pipeline's optimizer is replaced by a gate: `zero_grad()` clears the gradients only on the first micro-batch
  after a step, `step()` steps only on the last micro-batch of each group (`(micro_batch + 1) % num_steps == 0`);
- the loss is not scaled: the optimizer sees the *sum* of the group's gradients (divide the loss by num_steps in
  the model for a mean);
- data-parallel gradients are all-reduced (DDP) on the first micro-batch, on the `num_warmup_steps` first ones,
  on each group's last one and on `is_last_batch=True`; the others run under `no_sync()` of every
  DistributedDataParallel in the model and of every sharded collection (its DATA_PARALLEL replicas, which
  rectoolkit all-reduces in their lookup's backward where TorchRec wraps the lookup in DDP): all-reduce is linear,
  so where it happens changes no value, only how many bytes are sent;
- the tables of a fused (in-backward) optimizer are updated in every backward, as without accumulation: only the
  optimizer handed to the pipeline accumulates;
- when the batches run out (StopIteration) or on `is_last_batch=True`, a partial group steps at once and clears
  its gradients; at StopIteration that group's last micro-batches were not all-reduced (TorchRec's behaviour:
  pass `is_last_batch=True` on the last batch for an all-reduced final step), except the replicas' gradients,
  all-reduced before that step so that the replicas stay equal on every rank.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional

from torch import nn

from rectoolkit.distributed.sharded_ebc import ShardedCollection


@dataclass
class GradientAccumulationConfig:
    """How many micro-batches make one optimizer step (`num_steps`), and how many first ones always all-reduce
    (`num_warmup_steps`, at least 1: DDP's static_graph needs the first). `num_steps` > 1 turns `is_enabled` on.

    >>> GradientAccumulationConfig(num_steps=4)
    GradientAccumulationConfig(is_enabled=True, num_steps=4, num_warmup_steps=1)
    """

    is_enabled: bool = False
    num_steps: int = 1
    num_warmup_steps: int = 1

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"GradientAccumulationConfig: num_steps must be >= 1, got {self.num_steps}")
        if self.num_warmup_steps < 1:
            raise ValueError(f"GradientAccumulationConfig: num_warmup_steps must be >= 1, got "
                             f"{self.num_warmup_steps} (DDP's static_graph needs the first step all-reduced)")
        if self.num_steps > 1:
            self.is_enabled = True


class _GAOptimizerWrapper:
    """The optimizer the pipeline sees: zero_grad and step pass through at group boundaries only; every other
    attribute is the wrapped optimizer's."""

    def __init__(self, optimizer: Any, config: GradientAccumulationConfig) -> None:
        self._optimizer = optimizer
        self._config = config
        self._current_step = 0
        self._needs_zero_grad = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._needs_zero_grad:
            self._optimizer.zero_grad(set_to_none=set_to_none)
            self._needs_zero_grad = False

    def step(self, *args: Any, **kwargs: Any) -> None:
        if (self._current_step + 1) % self._config.num_steps == 0:
            self._optimizer.step(*args, **kwargs)
            self._needs_zero_grad = True

    def advance_step(self) -> None:
        self._current_step += 1

    def set_step(self, step: int) -> None:
        self._current_step = step

    def reset(self) -> None:
        self._current_step, self._needs_zero_grad = 0, True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)


class GradientAccumulationWrapper:
    """Gradient accumulation around `pipeline` (TorchRec's): its optimizer (`optimizer`, which the pipeline must
    hold as `_optimizer`) steps once every `config.num_steps` progress() calls; DDP all-reduces skipped in
    between (see the module's docstring). Any other attribute is the pipeline's. With `config.is_enabled` False it
    is the pipeline unchanged.

    >>> import torch
    >>> model = nn.Linear(2, 1)
    >>> class Step:  # a pipeline: zero_grad, forward, backward, step
    ...     def __init__(self, optimizer): self._optimizer = optimizer
    ...     def progress(self, it):
    ...         self._optimizer.zero_grad(); model(next(it)).sum().backward(); self._optimizer.step()
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    >>> wrapped = GradientAccumulationWrapper(Step(optimizer), optimizer, model, GradientAccumulationConfig(num_steps=2))
    >>> before = model.bias.item()
    >>> wrapped.progress(iter([torch.ones(1, 2)])); model.bias.item() == before  # accumulated, not stepped
    True
    >>> wrapped.progress(iter([torch.ones(1, 2)])); round(before - model.bias.item(), 6)  # two gradients of 1
    2.0
    """

    def __init__(self, pipeline: Any, optimizer: Any, model: nn.Module, config: GradientAccumulationConfig) -> None:
        self._pipeline = pipeline
        self._model = model
        self._config = config
        self._optimizer_wrapper = _GAOptimizerWrapper(optimizer, config)
        self._ddp_modules: Optional[List[Any]] = None
        if config.is_enabled and hasattr(pipeline, "_optimizer"):
            pipeline._optimizer = self._optimizer_wrapper

    @property
    def optimizer_wrapper(self) -> _GAOptimizerWrapper:
        """The gate the pipeline steps (step it yourself with a pipeline that holds no optimizer)."""
        return self._optimizer_wrapper

    @property
    def current_step(self) -> int:
        """Micro-batches trained since the start (or the last reset / set_step)."""
        return self._optimizer_wrapper._current_step

    def set_step(self, step: int) -> None:
        self._optimizer_wrapper.set_step(step)

    def reset(self) -> None:
        """Start counting micro-batches afresh, and reset the pipeline."""
        self._optimizer_wrapper.reset()
        if hasattr(self._pipeline, "reset"):
            self._pipeline.reset()

    def progress(self, dataloader_iter: Iterator[Any], is_last_batch: Optional[bool] = None) -> Any:
        """The pipeline's progress() on the next micro-batch; `is_last_batch=True` all-reduces it and steps a
        partial group. At StopIteration a partial group steps before the exception goes on."""
        if not self._config.is_enabled:
            return self._pipeline.progress(dataloader_iter)
        sync = self._all_reduces(bool(is_last_batch))
        try:
            with contextlib.nullcontext() if sync else self._no_sync():
                output = self._pipeline.progress(dataloader_iter)
        except StopIteration:  # nothing trained in this call: current_step counts the micro-batches done
            self._flush(self.current_step)
            raise
        self._optimizer_wrapper.advance_step()
        if is_last_batch:
            self._flush(self.current_step)
        return output

    def _all_reduces(self, is_last_batch: bool) -> bool:
        step = self.current_step
        return (is_last_batch or step == 0 or step < self._config.num_warmup_steps
                or (step + 1) % self._config.num_steps == 0)

    def _flush(self, micro_batches: int) -> None:
        if micro_batches % self._config.num_steps:
            for module in self._data_parallel_modules():
                if isinstance(module, ShardedCollection):  # one table on every rank: diverged, it would stay so
                    module.reduce_accumulated_gradients()
            self._optimizer_wrapper._optimizer.step()
            self._optimizer_wrapper._optimizer.zero_grad(set_to_none=True)
            self._optimizer_wrapper._needs_zero_grad = False

    @contextlib.contextmanager
    def _no_sync(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for ddp in self._data_parallel_modules():
                stack.enter_context(ddp.no_sync())
            yield

    def _data_parallel_modules(self) -> List[Any]:
        """The model's outer data-parallel wrapper (under a DMP: its `_dmp_wrapped_module`), if it has no_sync,
        and every DistributedDataParallel and sharded collection inside it (found once)."""
        if self._ddp_modules is None:
            modules: List[Any] = []
            root: Any = self._model
            wrapped = getattr(self._model, "_dmp_wrapped_module", None)
            if isinstance(wrapped, nn.Module):
                root = wrapped
            elif wrapped is not None and hasattr(wrapped, "no_sync"):
                modules.append(wrapped)
            if hasattr(root, "no_sync"):
                modules.append(root)
            if isinstance(root, nn.Module):
                modules += [m for m in root.modules() if m is not root
                            and isinstance(m, (nn.parallel.DistributedDataParallel, ShardedCollection))]
            self._ddp_modules = modules
        return self._ddp_modules

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipeline, name)


__all__ = ["GradientAccumulationConfig", "GradientAccumulationWrapper"]
