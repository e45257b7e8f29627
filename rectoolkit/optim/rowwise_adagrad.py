"""TorchRec's RowWiseAdagrad (torchrec.optim.rowwise_adagrad): Adagrad with one accumulator per row of a 2-D
weight, so every element of an embedding row gets the same adaptive step, for 1/dim of Adagrad's state.

For a weight W (rows x dim) with gradient G at step t (counting from 1):

    G  <- -G if maximize;   G <- G + weight_decay * W
    s  += mean(G * G, over the row)                    (s: rows x 1, starts at initial_accumulator_value)
    W  -= lr / (1 + (t - 1) * lr_decay) * G / (sqrt(s) + eps)

Every row is updated (a row with a zero gradient moves only by weight decay). Handed to
`apply_optimizer_in_backward` before sharding, it names fused row-wise Adagrad (fbgemm's EXACT_ROWWISE_ADAGRAD),
which updates the rows a batch touched only.

    >>> w = torch.nn.Parameter(torch.zeros(2, 2))
    >>> opt = RowWiseAdagrad([w], lr=0.1, eps=0.0)
    >>> w.grad = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    >>> opt.step()
    >>> [round(x, 5) for x in w[0].tolist()], opt.state[w]["sum"].flatten().tolist()   # 0.1 * g / sqrt(12.5)
    ([-0.08485, -0.11314], [12.5, 0.0])
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["RowWiseAdagrad"]


class RowWiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over 2-D parameters; TorchRec's arguments and state ("step", "sum" of shape rows x 1).

    TorchRec's also takes and drops any other keyword (for fbgemm's fused options); here one is refused by name,
    so a setting never goes unused without notice."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False,
                 **unused: Any) -> None:
        if unused:
            raise TypeError(f"RowWiseAdagrad: unsupported argument(s) {sorted(unused)}; it takes lr, lr_decay, "
                            "weight_decay, initial_accumulator_value, eps and maximize")
        for name, value in [("lr", lr), ("lr_decay", lr_decay), ("weight_decay", weight_decay),
                            ("initial_accumulator_value", initial_accumulator_value), ("eps", eps)]:
            if not value >= 0.0:
                raise ValueError(f"RowWiseAdagrad: {name} must be >= 0, got {value}")
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, maximize=maximize)
        super().__init__(params, defaults)
        for group_index, group in enumerate(self.param_groups):
            for index, param in enumerate(group["params"]):
                if param.dim() != 2:
                    raise ValueError(
                        f"RowWiseAdagrad: parameter {index} of group {group_index} has shape {tuple(param.shape)}; "
                        "it keeps one accumulator per row of a 2-D (embedding) weight: give the other parameters "
                        "to torch.optim.Adagrad")
                self.state[param]["step"] = torch.tensor(0.0)
                self.state[param]["sum"] = torch.full((param.shape[0], 1), float(initial_accumulator_value),
                                                      dtype=param.dtype, device=param.device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("RowWiseAdagrad: sparse gradients are not supported (give dense ones, or "
                                       "shard the table: its fused row-wise Adagrad updates the touched rows only)")
                state = self.state[param]
                state["step"] += 1
                grad = -param.grad if group["maximize"] else param.grad
                if group["weight_decay"]:
                    grad = grad.add(param, alpha=group["weight_decay"])
                state["sum"] += grad.square().mean(dim=1, keepdim=True)
                step_size = group["lr"] / (1 + (state["step"].item() - 1) * group["lr_decay"])
                param.addcdiv_(grad, state["sum"].sqrt().add_(group["eps"]), value=-step_size)
        return loss
