"""TorchRec's path torchrec.optim.apply_optimizer_in_backward (a path module, see rectoolkit.compat): torch's
`_apply_optimizer_in_backward`, which TorchRec's function calls. What it records on the tables' weights becomes
the sharded collections' fused optimizer (rectoolkit.distributed.fused_params)."""

from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

__all__ = ["apply_optimizer_in_backward"]
