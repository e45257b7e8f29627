"""TorchRec's path torchrec.optim.optimizers (a path module, see rectoolkit.compat): `in_backward_optimizer_filter`,
which lives in rectoolkit.optim.keyed."""

from rectoolkit.optim.keyed import in_backward_optimizer_filter

__all__ = ["in_backward_optimizer_filter"]
