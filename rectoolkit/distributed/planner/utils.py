"""TorchRec's module path torchrec.distributed.planner.utils (a path module: re-exports only; see rectoolkit.compat).
The helpers live in rectoolkit.planner.torchrec_utils."""

from rectoolkit.planner.torchrec_utils import (
    BinarySearchPredicate,
    bytes_to_gb,
    bytes_to_mb,
    gb_to_bytes,
    mb_to_bytes,
    placement,
    prod,
    sharder_name,
    storage_repr_in_gb,
)

__all__ = ["BinarySearchPredicate", "bytes_to_gb", "bytes_to_mb", "gb_to_bytes", "mb_to_bytes", "placement", "prod",
           "sharder_name", "storage_repr_in_gb"]
