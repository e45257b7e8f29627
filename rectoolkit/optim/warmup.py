"""A learning-rate schedule in stages around a keyed optimizer (TorchRec's torchrec.optim.warmup).

Each WarmupStage runs until iteration `max_iters` (counted from the start of training, not of the stage) and
sets lr = base lr * multiplier(iteration) * lr_scale, where the multiplier depends on the stage's policy
(`value` is its parameter):

| policy | multiplier at iteration i |
| --- | --- |
| LINEAR | value + (1 - value) * i / max_iters |
| CONSTANT | value |
| POLY | (1 - i / decay_iters) ** value (decay_iters defaults to max_iters) |
| STEP | value ** (i // decay_iters) (decay_iters defaults to 1) |
| INVSQRT | 1 / sqrt(i) |
| COSINE_ANNEALING_WARM_RESTARTS | value + (1 - value) * (1 + cos(pi * (i % sgdr_period) / sgdr_period)) / 2 |
| INTERPOLATE | value + (end_value - value) * (i - start_interpolating_iters) / (max_iters - start_interpolating_iters) |
| NONE | 1 |

After the last stage the lr stays at the base lr. The iteration and stage are kept in the optimizer's state under
the parameter key "__warmup", so they survive state_dict / load_state_dict (with a KeyedOptimizerWrapper inside).

    >>> from rectoolkit.optim.keyed import KeyedOptimizerWrapper
    >>> w = torch.nn.Parameter(torch.zeros(1))
    >>> inner = KeyedOptimizerWrapper({"w": w}, lambda params: torch.optim.SGD(params, lr=1.0))
    >>> opt = WarmupOptimizer(inner, [WarmupStage(WarmupPolicy.LINEAR, max_iters=4, value=0.5)], lr=0.2)
    >>> lrs = []
    >>> for _ in range(6):
    ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step()
    >>> lrs
    [0.1, 0.125, 0.15, 0.175, 0.2, 0.2]
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from rectoolkit.optim.keyed import KeyedOptimizer, OptimizerWrapper

__all__ = ["WarmupOptimizer", "WarmupPolicy", "WarmupStage", "lr_multiplier"]


@enum.unique
class WarmupPolicy(enum.Enum):
    """How the multiplier moves within a stage (TorchRec's names and values)."""

    NONE = "none"
    LINEAR = "linear"
    CONSTANT = "constant"
    POLY = "poly"
    STEP = "step"
    INVSQRT = "inv_sqrt"
    COSINE_ANNEALING_WARM_RESTARTS = "cosine_annealing_warm_restarts"
    INTERPOLATE = "interpolate"


@dataclass
class WarmupStage:
    """One stage of the schedule: its policy, the iteration it ends at, and the policy's parameters."""

    policy: WarmupPolicy = WarmupPolicy.LINEAR
    max_iters: int = 1
    value: float = 1.0
    lr_scale: float = 1.0
    decay_iters: int = -1  # POLY: the denominator (default max_iters); STEP: the step size (default 1)
    sgdr_period: int = 1
    start_interpolating_iters: Optional[int] = None  # INTERPOLATE only
    end_value: Optional[float] = None  # INTERPOLATE only


def _checked_stages(stages: List[WarmupStage]) -> List[WarmupStage]:
    """The stages with their decay_iters defaults filled in, then a last stage that keeps the base lr."""
    previous_end = 0
    for index, stage in enumerate(stages):
        stage.policy = WarmupPolicy(getattr(stage.policy, "value", stage.policy))  # TorchRec's member, or a string
        if stage.max_iters <= previous_end:
            raise ValueError(f"WarmupOptimizer: stage {index} ({stage.policy.name}) ends at max_iters="
                             f"{stage.max_iters}, not after the previous stage's {previous_end}; give increasing max_iters")
        if stage.policy == WarmupPolicy.INTERPOLATE:
            if stage.start_interpolating_iters is None or stage.end_value is None:
                raise ValueError(f"WarmupOptimizer: stage {index} is INTERPOLATE; set start_interpolating_iters "
                                 "and end_value")
            if stage.max_iters <= stage.start_interpolating_iters:
                raise ValueError(f"WarmupOptimizer: stage {index}: max_iters ({stage.max_iters}) must exceed "
                                 f"start_interpolating_iters ({stage.start_interpolating_iters})")
        previous_end = stage.max_iters
        if stage.decay_iters <= 0:
            stage.decay_iters = 1 if stage.policy == WarmupPolicy.STEP else stage.max_iters
    return list(stages) + [WarmupStage(policy=WarmupPolicy.NONE, max_iters=1 << 63, value=1.0)]


def lr_multiplier(stage: WarmupStage, iteration: int) -> float:
    """The stage's multiplier of the base lr at `iteration` (the table in the module docstring).

    >>> lr_multiplier(WarmupStage(WarmupPolicy.STEP, max_iters=10, value=0.5, decay_iters=2), 5)
    0.25
    """
    policy = stage.policy
    if policy == WarmupPolicy.LINEAR:
        multiplier = stage.value + (1.0 - stage.value) * iteration / stage.max_iters
    elif policy == WarmupPolicy.CONSTANT:
        multiplier = stage.value
    elif policy == WarmupPolicy.POLY:
        multiplier = math.pow(1 - iteration / stage.decay_iters, stage.value)
    elif policy == WarmupPolicy.STEP:
        multiplier = math.pow(stage.value, iteration // stage.decay_iters)
    elif policy == WarmupPolicy.INVSQRT:
        multiplier = 1.0 / math.sqrt(iteration)
    elif policy == WarmupPolicy.COSINE_ANNEALING_WARM_RESTARTS:
        position = (iteration % stage.sgdr_period) / stage.sgdr_period
        multiplier = stage.value + (1.0 - stage.value) * 0.5 * (1 + math.cos(math.pi * position))
    elif policy == WarmupPolicy.INTERPOLATE:
        start = stage.start_interpolating_iters
        multiplier = stage.value + (stage.end_value - stage.value) * (iteration - start) / (stage.max_iters - start)
    else:
        multiplier = 1.0
    return multiplier * stage.lr_scale


class WarmupOptimizer(OptimizerWrapper):
    """Sets the wrapped optimizer's lr by the stages before every step (TorchRec's WarmupOptimizer).

    Args:
        optimizer: the keyed optimizer to drive (KeyedOptimizerWrapper, CombinedOptimizer, DMP's fused one).
        stages: the schedule; after the last stage the lr stays at `lr`.
        lr: the base learning rate the multipliers scale.
        lr_param: the param_group key to set ("lr").
        param_name: the key of the stand-in parameter that holds the schedule's state.
    """

    def __init__(self, optimizer: KeyedOptimizer, stages: List[WarmupStage], lr: float = 0.1,
                 lr_param: str = "lr", param_name: str = "__warmup") -> None:
        super().__init__(optimizer)
        self._stages = _checked_stages(stages)
        self._lr_param = lr_param
        self._lr = lr
        self._warmup_param = torch.nn.Parameter()
        self._param_name = param_name
        self.params[param_name] = self._warmup_param
        self._set_lr(0, 0)  # a fused optimizer updates in the first backward, before any step()

    def _set_lr(self, iteration: int, stage_index: int) -> None:
        lr = self._lr * lr_multiplier(self._stages[stage_index], iteration)
        for group in self.param_groups:
            group[self._lr_param] = lr

    def _warmup_state(self) -> Tuple[int, int]:
        if self._warmup_param in self.state:
            iteration, stage_index = self.state[self._warmup_param]["warmup"].tolist()
            return iteration, stage_index
        return 0, 0

    def post_load_state_dict(self) -> None:
        self._set_lr(*self._warmup_state())

    def load_state_dict(self, state_dict: Any) -> None:
        """Resume the schedule (and the wrapped optimizer) from `state_dict`, also before this optimizer's first
        step (TorchRec requires a step or init_state() first)."""
        if self._param_name in state_dict["state"] and self._warmup_param not in self.state:
            self.state[self._warmup_param] = {"warmup": torch.zeros(2, dtype=torch.long)}  # loaded in place
        super().load_state_dict(state_dict)

    def step(self, closure: Any = None) -> None:
        super().step(closure)
        iteration, stage_index = self._warmup_state()
        iteration += 1
        if iteration > self._stages[stage_index].max_iters and stage_index + 1 < len(self._stages):
            stage_index += 1
        self._set_lr(iteration, stage_index)
        self.state[self._warmup_param] = {"warmup": torch.tensor([iteration, stage_index], dtype=torch.long)}
