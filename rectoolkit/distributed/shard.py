"""TorchRec's path torchrec.distributed.shard (a path module, see rectoolkit.compat): shard_modules, which lives
in rectoolkit.quant.shard_modules (its default sharders include the quantized collection's)."""

from rectoolkit.quant.shard_modules import _shard_modules, get_default_sharders, shard_modules

__all__ = ["_shard_modules", "get_default_sharders", "shard_modules"]
