"""TorchRec's small planner helpers (torchrec.distributed.planner.utils): byte units, `prod`, a sharder's name, a
shard's placement string, a Storage in GB, and the binary search TorchRec's proposers probe with; path:
rectoolkit.distributed.planner.utils.

    >>> bytes_to_gb(3 * 1024**3), mb_to_bytes(1.5), placement("cuda", 5, 4)
    (3.0, 1572864, 'rank:5/cuda:1')
"""

import math
from typing import Any, Iterable, Optional, Type, Union

from rectoolkit.planner.hardware import Storage

__all__ = ["BinarySearchPredicate", "bytes_to_gb", "bytes_to_mb", "gb_to_bytes", "mb_to_bytes", "placement", "prod",
           "sharder_name", "storage_repr_in_gb"]

_MB = 1024 * 1024
_GB = 1024 * _MB


def bytes_to_gb(num_bytes: int) -> float:
    return float(num_bytes / _GB)


def bytes_to_mb(num_bytes: Union[float, int]) -> float:
    return float(num_bytes / _MB)


def gb_to_bytes(gb: float) -> int:
    return int(gb * _GB)


def mb_to_bytes(mb: float) -> int:
    return int(mb * _MB)


def prod(iterable: Iterable[int]) -> int:
    """The product of the items (1 for none)."""
    return math.prod(iterable, start=1)


def sharder_name(t: Type[Any]) -> str:
    """A sharder class's qualified name, "module.ClassName", as TorchRec keys its sharders."""
    return f"{t.__module__}.{t.__name__}"


def placement(compute_device: str, rank: int, local_size: int) -> str:
    """A shard's placement string: "rank:5/cuda:1" on a GPU (device index rank % local_size), "rank:5/cpu"."""
    device = f"{compute_device}:{rank % local_size}" if compute_device in ("cuda", "mtia") else compute_device
    return f"rank:{rank}/{device}"


def storage_repr_in_gb(storage: Optional[Storage]) -> str:
    """"Storage(hbm = 1.5 GB, ddr = 0.0 GB)" (rounded to 3 places), "" for None."""
    if storage is None:
        return ""
    return f"Storage(hbm = {round(bytes_to_gb(storage.hbm), 3)} GB, ddr = {round(bytes_to_gb(storage.ddr), 3)} GB)"


class BinarySearchPredicate:
    """The values X in [A, B] to try on a step predicate F (true up to some X, false after) to find the largest X
    with F(X) true; stops once fewer than `tolerance` values remain. Call next(prior_result) with F of the last
    value (ignored the first time); None means done."""

    def __init__(self, A: int, B: int, tolerance: int) -> None:
        self.left, self.right, self.tolerance = A, B, tolerance
        self.first = True

    def next(self, prior_result: bool) -> Optional[int]:
        if self.right - self.left < self.tolerance:
            return None
        middle = self._mid()
        if self.first:
            self.first = False
            return middle
        if prior_result:
            self.left = middle + 1
        else:
            self.right = middle - 1
        return None if self.right - self.left < self.tolerance else self._mid()

    def _mid(self) -> int:
        return self.left + (self.right - self.left) // 2
