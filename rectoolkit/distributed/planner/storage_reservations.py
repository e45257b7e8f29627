"""TorchRec's module path torchrec.distributed.planner.storage_reservations (a path module, see rectoolkit.compat);
the reservations themselves are rectoolkit.planner.storage_reservations."""

from rectoolkit.planner.storage_reservations import (FixedAbsoluteStorageReservation,
                                                     FixedPercentageStorageReservation, HeuristicalStorageReservation,
                                                     StorageReservation)

__all__ = ["FixedAbsoluteStorageReservation", "FixedPercentageStorageReservation", "HeuristicalStorageReservation",
           "StorageReservation"]
