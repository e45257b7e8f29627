"""The optimizer of a collection whose embedding updates are fused into backward (TorchRec's EmbeddingFusedOptimizer).

Updates happen inside loss.backward(); step() only pushes the param group's hyper-parameters (lr) into
the kernel, so an lr scheduler or a manual `opt.param_groups[0]["lr"] = ...` takes effect. The collection
also pushes them before each forward, so a change made after step() is used by the very next backward.

    >>> import rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
    ...                                   feature_names=["f"])], optimizer="sgd", lr=0.5)
    >>> ebc.fused_optimizer.param_groups[0]["lr"]
    0.5
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from rectoolkit.optim.keyed import KeyedOptimizer


class EmbeddingFusedOptimizer(KeyedOptimizer):
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
