"""Gradient clipping before the wrapped optimizer's step (TorchRec's torchrec.optim.clipping).

NORM scales every gradient by min(1, max_gradient / (total norm + 1e-6)), the total p-norm taken over all the
optimizer's parameters (torch.nn.utils.clip_grad_norm_); VALUE clamps each gradient entry to
[-max_gradient, max_gradient]; NONE leaves them. With `enable_global_grad_clip` and `param_to_pgs`, the norm of
the parameters sharded over process groups is summed over each group's ranks (all-reduce of norm**p), so every
rank clips by the norm of the whole model.

    >>> from rectoolkit.optim.keyed import KeyedOptimizerWrapper
    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> opt = GradientClippingOptimizer(KeyedOptimizerWrapper({"w": w}, lambda p: torch.optim.SGD(p, lr=1.0)),
    ...                                 clipping=GradientClipping.NORM, max_gradient=1.0)
    >>> w.grad = torch.tensor([3.0, 4.0]); opt.step()
    >>> [round(x, 4) for x in w.tolist()], round(float(opt.last_total_grad_norm), 4)
    ([-0.6, -0.8], 5.0)
"""

from __future__ import annotations

import enum
from collections import defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from rectoolkit.optim.keyed import KeyedOptimizer, OptimizerWrapper

__all__ = ["GradientClipping", "GradientClippingOptimizer"]


@enum.unique
class GradientClipping(enum.Enum):
    """TorchRec's clipping modes."""

    NORM = "norm"
    VALUE = "value"
    NONE = "none"


class GradientClippingOptimizer(OptimizerWrapper):
    """Clips the gradients of the wrapped optimizer's parameters, then steps it.

    Args:
        optimizer: the keyed optimizer to wrap.
        clipping: NORM, VALUE or NONE.
        max_gradient: the largest total norm (NORM) or entry (VALUE).
        norm_type: p of the p-norm; float("inf") (or "inf") for the largest entry.
        enable_global_grad_clip: take the norm of parameters sharded over process groups across their ranks.
        param_to_pgs: parameter -> the process groups it is sharded over (with enable_global_grad_clip).
        track_grad_norm: keep the total norm of every step (VALUE / NONE too) in `last_total_grad_norm`.
    """

    def __init__(self, optimizer: KeyedOptimizer, clipping: GradientClipping = GradientClipping.NONE,
                 max_gradient: float = 0.1, norm_type: Union[float, str] = 2.0, enable_global_grad_clip: bool = False,
                 param_to_pgs: Optional[Dict[torch.nn.Parameter, List[Any]]] = None,
                 track_grad_norm: bool = False) -> None:
        super().__init__(optimizer)
        self._clipping = GradientClipping(clipping)
        self._max_gradient = max_gradient
        self._norm_type = float(norm_type)
        self._track_grad_norm = track_grad_norm
        self._last_total_grad_norm: Optional[torch.Tensor] = None
        self._step_num = 0
        self._replicate_params: List[torch.Tensor] = []
        self._sharded_params: Dict[Tuple[Any, ...], List[torch.Tensor]] = defaultdict(list)
        for group in self.param_groups:
            for param in group["params"]:
                pgs = (param_to_pgs or {}).get(param) if enable_global_grad_clip else None
                if pgs:
                    self._sharded_params[tuple(pgs)].append(param)
                else:
                    self._replicate_params.append(param)
        if self._clipping == GradientClipping.VALUE and self._sharded_params:
            raise NotImplementedError("GradientClippingOptimizer: VALUE clipping of parameters sharded over process "
                                      "groups is not supported (nor in TorchRec); use NORM, or leave param_to_pgs None")

    @property
    def last_total_grad_norm(self) -> Optional[torch.Tensor]:
        """The total gradient norm of the last step (None before the first, or when nothing was measured)."""
        return self._last_total_grad_norm

    def step(self, closure: Any = None) -> None:
        if any(p.device.type == "meta" for p in self._all_params()):
            self._last_total_grad_norm = None  # nothing to clip on the meta device
        elif self._clipping == GradientClipping.NORM:
            self._last_total_grad_norm = self.clip_grad_norm_()
        else:
            if self._track_grad_norm:
                self._last_total_grad_norm, _ = self.compute_total_grad_norm()
            if self._clipping == GradientClipping.VALUE:
                torch.nn.utils.clip_grad_value_(self._replicate_params, clip_value=self._max_gradient)
        super().step(closure)
        self._step_num += 1

    def _all_params(self) -> List[torch.Tensor]:
        return self._replicate_params + [p for params in self._sharded_params.values() for p in params]

    def compute_total_grad_norm(self) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
        """The p-norm of all gradients (sharded ones summed over their groups' ranks), and the gradients."""
        replicate = _grads(self._replicate_params)
        sharded = {pgs: _grads(params) for pgs, params in self._sharded_params.items()}
        everything = [g for grads in sharded.values() for g in grads] + replicate
        if not everything and not self._sharded_params:
            return None, []
        infinite = self._norm_type == float("inf")
        total = torch.tensor(float("-inf") if infinite else 0.0)
        for pgs, grads in sharded.items():
            total = _combine(total, _norm_power(grads, self._norm_type, pgs), infinite)
        if replicate:
            total = _combine(total, _norm_power(replicate, self._norm_type, ()), infinite)
        return (total if infinite else total.pow(1.0 / self._norm_type)), everything

    def clip_grad_norm_(self) -> Optional[torch.Tensor]:
        """Scale all gradients so that their total norm is at most max_gradient; returns the norm before."""
        total, grads = self.compute_total_grad_norm()
        if total is None:
            return None
        torch._foreach_mul_(grads, torch.clamp(self._max_gradient / (total + 1e-6), max=1.0))
        return total


def _grads(params: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None and p.grad.numel() > 0]


def _combine(a: torch.Tensor, b: torch.Tensor, infinite: bool) -> torch.Tensor:
    return torch.maximum(a, b.to(a.device)) if infinite else a + b.to(a.device)


def _norm_power(grads: List[torch.Tensor], norm_type: float, pgs: Sequence[Any]) -> torch.Tensor:
    """norm ** p of `grads` (the max for the inf-norm), reduced over the ranks of each process group."""
    infinite = norm_type == float("inf")
    if not grads:
        value = torch.tensor(float("-inf") if infinite else 0.0)
    else:
        value = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, norm_type)), norm_type)
        if not infinite:
            value = value ** norm_type
    for pg in pgs:
        dist.all_reduce(value, op=dist.ReduceOp.MAX if infinite else dist.ReduceOp.SUM, group=pg)
    return value
