"""The optimizer of a collection whose embedding updates are fused into backward (TorchRec's EmbeddingFusedOptimizer).

Updates happen inside loss.backward(); step() only pushes the param group's hyper-parameters (lr) into
the kernel, so an lr scheduler or a manual `opt.param_groups[0]["lr"] = ...` takes effect. The collection
also pushes them before each forward, so a change made after step() is used by the very next backward.

    >>> import rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                   feature_names=["f"])], optimizer="sgd", lr=0.5)
    >>> ebc.fused_optimizer.param_groups[0]["lr"]
    0.5

TorchRec's names of torchrec.optim.fused are here too: FusedOptimizer (the abstract KeyedOptimizer whose updates
happen in backward; EmbeddingFusedOptimizer is one), EmptyFusedOptimizer (no params, no-op step and zero_grad) and
FusedOptimizerModule (the interface of modules with a `fused_optimizer` property: rectoolkit's sharded collections
and DistributedModelParallel are registered as ones, as TorchRec's are).
"""

from __future__ import annotations

import abc
from typing import Any, Mapping

import torch

from rectoolkit.optim.keyed import KeyedOptimizer


class FusedOptimizer(KeyedOptimizer, abc.ABC):
    """TorchRec's: a KeyedOptimizer whose weight updates happen during the backward pass; subclasses implement
    step() and zero_grad() (no weight update in step())."""

    @abc.abstractmethod
    def step(self, closure: Any = None) -> None: ...

    @abc.abstractmethod
    def zero_grad(self, set_to_none: bool = False) -> None: ...

    def __repr__(self) -> str:
        return torch.optim.Optimizer.__repr__(self)


class EmptyFusedOptimizer(FusedOptimizer):
    """TorchRec's: a FusedOptimizer with no parameters; step() and zero_grad() do nothing."""

    def __init__(self) -> None:
        super().__init__({}, {}, {})

    def step(self, closure: Any = None) -> None:
        pass

    def zero_grad(self, set_to_none: bool = False) -> None:
        pass


class FusedOptimizerModule(abc.ABC):
    """TorchRec's: the interface of a module that updates its weights during backward, its `fused_optimizer`
    property the KeyedOptimizer of those updates. `isinstance(m, FusedOptimizerModule)` holds for rectoolkit's
    sharded collections and DistributedModelParallel (registered), as for TorchRec's."""

    @property
    @abc.abstractmethod
    def fused_optimizer(self) -> KeyedOptimizer: ...


class EmbeddingFusedOptimizer(FusedOptimizer):
    """Keyed view of a fused kernel's optimizer: params are the tables' weights, state is the kernel's state."""

    def __init__(self, owner: Any, params: Mapping[str, torch.Tensor]) -> None:
        self._owner = owner  # the collection; its kernel may be rebuilt (device moves), so look it up each time
        config = owner._kernel.optimizer
        super().__init__(params, {}, [{"params": list(params.values()), "lr": config.lr}])

    @property
    def kernel(self):
        return self._owner._kernel

    @property
    def state(self) -> Mapping[Any, Any]:
        states = self.kernel.split_optimizer_states()
        return {param: states[t] for t, param in enumerate(self.params.values()) if states[t]}

    def sync_hyperparameters(self) -> None:
        """Push the param group's lr into the kernel (cheap when unchanged)."""
        lr = float(self.param_groups[0]["lr"])
        if lr != self.kernel.get_learning_rate():
            self.kernel.set_learning_rate(lr)

    def step(self, closure: Any = None) -> Any:
        loss = closure() if closure is not None else None
        self.sync_hyperparameters()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: fused updates never write .grad."""

    def post_load_state_dict(self) -> None:
        self.sync_hyperparameters()

    def set_optimizer_step(self, step: int) -> None:
        """TorchRec's: the step count the next updates continue from (Adam's bias correction reads it)."""
        if hasattr(self.kernel, "tbe"):
            self.kernel.tbe.set_optimizer_step(int(step))  # fbgemm's own, as TorchRec calls it
        else:
            self.kernel.num_updates = int(step)

    def update_hyper_parameters(self, params_dict: Mapping[str, Any]) -> None:
        """TorchRec's: here "lr" (the param group's, pushed at once); other hyper-parameters are refused by name."""
        if set_lr_only(self, params_dict, "after the collection is built (only 'lr'); rebuild it with the new values"):
            self.sync_hyperparameters()


def set_lr_only(optimizer: KeyedOptimizer, params_dict: Mapping[str, Any], fix: str) -> bool:
    """update_hyper_parameters of a fused optimizer: "lr" goes into param_groups[0] (True: push it); other keys are
    refused, naming them (`fix`: why and what to do instead)."""
    others = sorted(set(params_dict) - {"lr"})
    if others:
        raise NotImplementedError(f"{type(optimizer).__name__}.update_hyper_parameters: {others} cannot be changed {fix}")
    if "lr" not in params_dict:
        return False
    optimizer.param_groups[0]["lr"] = float(params_dict["lr"])
    return True
