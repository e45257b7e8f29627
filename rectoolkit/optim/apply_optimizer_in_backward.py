"""TorchRec's torchrec.optim.apply_optimizer_in_backward: torch's `_apply_optimizer_in_backward` under TorchRec's
name, with TorchRec's DeprecationWarning. What it records on the tables' weights becomes the sharded collections'
fused optimizer (rectoolkit.distributed.fused_params).

torch.distributed.optim is imported at the call, as TorchRec's function does: importing it loads FSDP and DTensor
(about a third of `import rectoolkit`'s time otherwise, in every launched worker)."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Iterable, Type

import torch

__all__ = ["apply_optimizer_in_backward"]


def apply_optimizer_in_backward(optimizer_class: Type[torch.optim.Optimizer], params: Iterable[torch.nn.Parameter],
                                optimizer_kwargs: Dict[str, Any]) -> None:
    """Record `optimizer_class(**optimizer_kwargs)` on each of `params`, run on it in backward (torch's
    `_apply_optimizer_in_backward`; deprecated in TorchRec in its favour, so it warns as TorchRec's does)."""
    from torch.distributed.optim import _apply_optimizer_in_backward

    warnings.warn("This API is deprecated. Please use Pytorch Distributed's _apply_optimizer_in_backward API "
                  "instead.", DeprecationWarning, stacklevel=2)
    _apply_optimizer_in_backward(optimizer_class=optimizer_class, params=params, optimizer_kwargs=optimizer_kwargs)
