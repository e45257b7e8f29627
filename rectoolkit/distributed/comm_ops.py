"""TorchRec's module path torchrec.distributed.comm_ops (a path module, see rectoolkit.compat): the switch of
the embedding gradients' division by the world size. The collectives themselves are rectoolkit.distributed.comm."""

from rectoolkit.distributed.comm import get_gradient_division, set_gradient_division

__all__ = ["get_gradient_division", "set_gradient_division"]
