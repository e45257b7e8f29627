"""TorchRec's path torchrec.distributed.shard (a path module, see rectoolkit.compat): shard and shard_modules, which
live in rectoolkit.quant.shard_modules (their default sharders include the quantized collection's)."""

from rectoolkit.quant.shard_modules import _shard_modules, get_default_sharders, shard, shard_modules

__all__ = ["_shard_modules", "get_default_sharders", "shard", "shard_modules"]
