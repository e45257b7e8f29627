"""Optimizer updates applied to the rows one batch touched (the pure-torch twin of fbgemm's fused optimizers).

The rules are fbgemm's "exact" ones: the gradients of duplicate ids in a batch are summed first, then every
touched row is updated once. For a touched row with summed gradient g (and only touched rows):

- SGD:              w -= lr * g
- ADAGRAD:          m += g * g;              w -= lr * g / (sqrt(m) + eps)          (m per element)
- ROWWISE_ADAGRAD:  m += mean(g * g);        w -= lr * g / (sqrt(m) + eps)          (m one per row)
- ADAM:             m1 = b1 m1 + (1-b1) g;   m2 = b2 m2 + (1-b2) g*g
                    w -= lr * (m1/(1-b1^t) / (sqrt(m2/(1-b2^t)) + eps) + weight_decay * w)
                    (t counts the updates of the whole kernel, not of the row: fbgemm's "lazy" Adam)

With `gradient_clipping`, as fbgemm: each bag's output gradient is clamped to [-max_gradient, max_gradient]
before it reaches its ids (before per-id weights, before duplicates are summed).

    >>> cfg = FusedOptimizerConfig("row_wise_adagrad", lr=0.1, eps=0.0)
    >>> weight = torch.zeros(3, 2); state = init_optimizer_state(cfg, 3, 2)
    >>> apply_row_update(cfg, weight, state, torch.tensor([1]), torch.tensor([[3.0, 4.0]]), step=1)
    >>> [round(x, 5) for x in weight[1].tolist()], state["momentum1"].tolist()  # 0.1 * g / sqrt(12.5)
    ([-0.08485, -0.11314], [0.0, 12.5, 0.0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Union

import torch

from rectoolkit.kernels.optimizer_state import EmbOptimType


@dataclass
class FusedOptimizerConfig:
    """An optimizer fused into an embedding lookup's backward, with fbgemm's hyper-parameters and defaults.

        >>> FusedOptimizerConfig("exact_adagrad", lr=0.05).optimizer
        <EmbOptimType.ADAGRAD: 'adagrad'>
    """

    optimizer: Union[EmbOptimType, str] = EmbOptimType.SGD
    lr: float = 0.01
    eps: float = 1.0e-8
    beta1: float = 0.9
    beta2: float = 0.999
    weight_decay: float = 0.0
    # fbgemm's: each bag's output gradient clamped to [-max_gradient, max_gradient] before it reaches its ids'
    # rows (before per-id weights and before duplicates are summed)
    gradient_clipping: bool = False
    max_gradient: float = 1.0

    def __post_init__(self) -> None:
        self.optimizer = EmbOptimType.parse(self.optimizer)
        if self.lr < 0:
            raise ValueError(f"fused optimizer: lr must be >= 0, got {self.lr}")
        if self.gradient_clipping and not self.max_gradient > 0:
            raise ValueError(f"fused optimizer: gradient_clipping needs max_gradient > 0, got {self.max_gradient}")
        if self.weight_decay and self.optimizer != EmbOptimType.ADAM:
            raise ValueError(
                f"fused optimizer {self.optimizer.value}: weight_decay is only supported for adam here "
                f"(got weight_decay={self.weight_decay}); add an L2 term to the loss instead"
            )

    @classmethod
    def from_fused_params(cls, fused_params: Mapping[str, Any]) -> "FusedOptimizerConfig":
        """Build from TorchRec's `fused_params` dict ({"optimizer": ..., "learning_rate": ..., "eps": ...}).

        Its per-table keys (TABLE_OPTION_KEYS: stochastic_rounding, output_dtype, bounds_check_mode, enforce_hbm and
        the cache settings) are not the optimizer's: the sharded collections take them as every table's default
        (rectoolkit.distributed.fused_params.with_table_options). `momentum` is fbgemm's LARS-SGD momentum, which
        none of these optimizers reads (as in fbgemm); nor do they read `weight_decay_mode` (_check_weight_decay_mode)."""
        params = dict(fused_params)
        known = set(OPTIMIZER_KEYS) | set(TABLE_OPTION_KEYS) | {"momentum", "weight_decay_mode"}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"fused_params: unsupported keys {unknown}; supported: {sorted(known)}")
        if "learning_rate" in params:
            params["lr"] = params.pop("learning_rate")
        momentum = params.pop("momentum", None)
        if momentum is not None and not isinstance(momentum, (int, float)):
            raise ValueError(f"fused_params: momentum must be a number, got {momentum!r}")
        mode = params.pop("weight_decay_mode", None)
        config = cls(**{key: value for key, value in params.items() if key not in TABLE_OPTION_KEYS})
        _check_weight_decay_mode(mode)
        return config

    @classmethod
    def from_torch_optimizer(cls, optimizer_class: type, kwargs: Mapping[str, Any]) -> "FusedOptimizerConfig":
        """Translate (an optimizer class, kwargs) as given to apply_optimizer_in_backward: torch.optim's or
        torchrec.optim's SGD, Adagrad, Adam, or RowWiseAdagrad (matched by name, as TorchRec maps them)."""
        name = optimizer_class.__name__.lower()
        table = {"sgd": EmbOptimType.SGD, "adagrad": EmbOptimType.ADAGRAD, "adam": EmbOptimType.ADAM,
                 "rowwiseadagrad": EmbOptimType.ROWWISE_ADAGRAD}
        if name not in table:
            raise ValueError(f"cannot fuse {optimizer_class.__name__} into the embedding backward; rectoolkit fuses "
                             "SGD, Adagrad, Adam (torch.optim's or torchrec.optim's) and RowWiseAdagrad")
        kw = dict(kwargs)
        config = cls(table[name], lr=float(kw.pop("lr", 0.01)))
        if "eps" in kw:
            config.eps = float(kw.pop("eps"))
        if "betas" in kw:
            config.beta1, config.beta2 = (float(b) for b in kw.pop("betas"))
        if "weight_decay" in kw:
            config.weight_decay = float(kw.pop("weight_decay"))
            config.__post_init__()
        if kw:
            raise ValueError(f"cannot fuse {optimizer_class.__name__} with {sorted(kw)}: the fused optimizers take lr, "
                             "eps, betas and weight_decay (Adam) only; leave the others out")
        return config


OPTIMIZER_KEYS = ("optimizer", "learning_rate", "lr", "eps", "beta1", "beta2", "weight_decay", "gradient_clipping",
                  "max_gradient")
# TorchRec's per-table options that a sharder's fused_params may hold (ParameterSharding's, and the cache's)
TABLE_OPTION_KEYS = ("stochastic_rounding", "output_dtype", "bounds_check_mode", "enforce_hbm", "cache_load_factor",
                     "cache_algorithm", "cache_precision", "prefetch_pipeline", "cache_reserved_memory")


def _check_weight_decay_mode(mode: Any) -> None:
    """fbgemm's WeightDecayMode. It changes nothing here, as in fbgemm for these optimizers: weight_decay > 0 is
    Adam's only (refused for the others), and fbgemm's Adam applies its own rule, w -= lr * weight_decay * w,
    whatever the mode says."""
    if mode is not None and str(getattr(mode, "name", mode)).upper() not in (
            "NONE", "L2", "DECOUPLE", "COUNTER", "COWCLIP", "DECOUPLE_GLOBAL"):
        raise ValueError(f"fused_params: weight_decay_mode={mode!r} is not one of fbgemm's WeightDecayMode members")


def optimizer_state_names(optimizer: Union[EmbOptimType, str]) -> tuple:
    """Names of the state tensors kept per table (fbgemm's names)."""
    return {
        EmbOptimType.SGD: (),
        EmbOptimType.ADAGRAD: ("momentum1",),
        EmbOptimType.ROWWISE_ADAGRAD: ("momentum1",),
        EmbOptimType.ADAM: ("momentum1", "momentum2"),
    }[EmbOptimType.parse(optimizer)]


def init_optimizer_state(
    config: FusedOptimizerConfig, num_rows: int, embedding_dim: int, device: Union[str, torch.device] = "cpu"
) -> Dict[str, torch.Tensor]:
    """Zero state for a block of num_rows x embedding_dim weights: {"momentum1": ..., "momentum2": ...}."""
    shape = (num_rows,) if config.optimizer == EmbOptimType.ROWWISE_ADAGRAD else (num_rows, embedding_dim)
    return {name: torch.zeros(shape, dtype=torch.float32, device=device) for name in optimizer_state_names(config.optimizer)}


@torch.no_grad()
def apply_row_update(
    config: FusedOptimizerConfig,
    weight: torch.Tensor,
    state: Dict[str, torch.Tensor],
    rows: torch.Tensor,
    grad_rows: torch.Tensor,
    step: int,
    lr: float | None = None,
) -> None:
    """Update weight[rows] in place from grad_rows (one row per entry of `rows`; rows must be unique).

    `step` (1-based) is the kernel's update count, used by Adam's bias correction; `lr` overrides config.lr.
    """
    lr = config.lr if lr is None else lr
    grad = grad_rows.float()
    kind = config.optimizer
    if kind == EmbOptimType.SGD:
        weight.index_add_(0, rows, grad.to(weight.dtype), alpha=-lr)
        return
    if kind == EmbOptimType.ADAGRAD:
        momentum = state["momentum1"].index_select(0, rows).add_(grad * grad)
        state["momentum1"].index_copy_(0, rows, momentum)
        weight.index_add_(0, rows, (-lr * grad / (momentum.sqrt_() + config.eps)).to(weight.dtype))
        return
    if kind == EmbOptimType.ROWWISE_ADAGRAD:
        momentum = state["momentum1"].index_select(0, rows).add_((grad * grad).mean(dim=1))
        state["momentum1"].index_copy_(0, rows, momentum)
        multiplier = lr / (momentum.sqrt_() + config.eps)
        weight.index_add_(0, rows, (-multiplier.unsqueeze(1) * grad).to(weight.dtype))
        return
    if kind == EmbOptimType.ADAM:
        m1 = state["momentum1"].index_select(0, rows).mul_(config.beta1).add_(grad, alpha=1 - config.beta1)
        m2 = state["momentum2"].index_select(0, rows).mul_(config.beta2).addcmul_(grad, grad, value=1 - config.beta2)
        state["momentum1"].index_copy_(0, rows, m1)
        state["momentum2"].index_copy_(0, rows, m2)
        m1_hat = m1 / (1 - config.beta1**step)
        v_hat = m2 / (1 - config.beta2**step)
        update = m1_hat / (v_hat.sqrt_() + config.eps)
        if config.weight_decay:
            update.add_(weight.index_select(0, rows).float(), alpha=config.weight_decay)
        weight.index_add_(0, rows, (-lr * update).to(weight.dtype))
        return
    raise ValueError(f"no row update rule for {kind}")
