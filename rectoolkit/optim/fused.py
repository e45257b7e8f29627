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
