"""TorchRec's torchrec.optim.optimizers: the names of the embedding optimizers that fuse into backward.

TorchRec code picks a sharded collection's fused optimizer by handing one of these classes (or torch.optim's SGD,
Adagrad, Adam, or `RowWiseAdagrad`) to `apply_optimizer_in_backward` before sharding:

    apply_optimizer_in_backward(torchrec.optim.Adagrad, ebc.parameters(), {"lr": 0.02})
    model = DistributedModelParallel(ebc, ...)   # its shards update in backward with exact Adagrad, lr 0.02

As in TorchRec, they are names, not optimizers: `step()` raises. rectoolkit fuses SGD, Adagrad, Adam and
RowWiseAdagrad (rectoolkit.kernels.fused_optimizers); sharding a collection that names LAMB, LarsSGD,
PartialRowWiseAdam or PartialRowWiseLAMB raises, naming the supported ones.

    >>> import torch
    >>> from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig
    >>> FusedOptimizerConfig.from_torch_optimizer(Adagrad, {"lr": 0.02}).optimizer
    <EmbOptimType.ADAGRAD: 'adagrad'>
    >>> Adagrad([torch.nn.Parameter(torch.zeros(2, 2))], lr=0.02).step()
    Traceback (most recent call last):
    ...
    NotImplementedError: torchrec.optim.Adagrad names the fused embedding optimizer for apply_optimizer_in_backward; it does not run by itself (as in TorchRec): use torch.optim.Adagrad for parameters that are not sharded
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from rectoolkit.optim.keyed import in_backward_optimizer_filter

__all__ = ["Adagrad", "Adam", "LAMB", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB", "SGD",
           "in_backward_optimizer_filter"]


class _FusedOptimizerName(torch.optim.Optimizer):
    """A class that names a fused embedding optimizer; it keeps its parameters and keyword arguments (what
    `apply_optimizer_in_backward` records) and does not step."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **kwargs: Any) -> None:
        self._params = params
        self._kwargs = kwargs

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        name = type(self).__name__
        dense = {"SGD": "torch.optim.SGD", "Adagrad": "torch.optim.Adagrad", "Adam": "torch.optim.Adam"}.get(
            name, "a torch.optim optimizer")
        raise NotImplementedError(
            f"torchrec.optim.{name} names the fused embedding optimizer for apply_optimizer_in_backward; it does "
            f"not run by itself (as in TorchRec): use {dense} for parameters that are not sharded")


class SGD(_FusedOptimizerName):
    """Fused exact SGD (fbgemm's EXACT_SGD)."""


class Adagrad(_FusedOptimizerName):
    """Fused exact Adagrad, one accumulator per element (fbgemm's EXACT_ADAGRAD)."""


class Adam(_FusedOptimizerName):
    """Fused Adam (fbgemm's ADAM)."""


class LAMB(_FusedOptimizerName):
    """fbgemm's LAMB: not fused by rectoolkit (sharding a collection that names it raises)."""


class LarsSGD(_FusedOptimizerName):
    """fbgemm's LARS_SGD: not fused by rectoolkit (sharding a collection that names it raises)."""


class PartialRowWiseAdam(_FusedOptimizerName):
    """fbgemm's PARTIAL_ROWWISE_ADAM: not fused by rectoolkit (sharding a collection that names it raises)."""


class PartialRowWiseLAMB(_FusedOptimizerName):
    """fbgemm's PARTIAL_ROWWISE_LAMB: not fused by rectoolkit (sharding a collection that names it raises)."""
