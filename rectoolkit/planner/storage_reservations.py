"""Memory the planner keeps free of tables: TorchRec's storage reservations, for EmbeddingShardingPlanner's
`storage_reservation=` argument.

- FixedPercentageStorageReservation(percentage): each rank's HBM capacity shrinks by `percentage`.
- FixedAbsoluteStorageReservation(hbm_reserved_bytes): each rank's HBM capacity shrinks by that many bytes.
- HeuristicalStorageReservation(percentage, parameter_multiplier=6.0, dense_tensor_estimate=None): the
  percentage of HBM, and the dense part of the model at `parameter_multiplier` times its parameter bytes (weights,
  optimizer state, DDP buckets), or `dense_tensor_estimate` bytes when given, in place of the planner's own dense
  estimate (fp32 weights and gradients). TorchRec also reserves room for the input batches; rectoolkit's cost
  model prices those itself, so that part is not reserved twice.

As in TorchRec, the percentages apply to HBM only (on a "cpu" topology they change nothing), and the dense part is
reserved in HBM on cuda and in host memory on cpu.

    >>> from rectoolkit.planner.topology import Topology
    >>> topology, _ = FixedPercentageStorageReservation(0.25).reserve_for(Topology(world_size=2, hbm_cap=100), 0, 8.0)
    >>> topology.hbm_cap, topology.ddr_cap == Topology(world_size=2).ddr_cap
    ([75, 75], True)
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from rectoolkit.planner.topology import Topology

__all__ = ["FixedAbsoluteStorageReservation", "FixedPercentageStorageReservation", "HeuristicalStorageReservation",
           "StorageReservation"]


class StorageReservation:
    """Base of the reservations: `reserve_for(topology, dense_weight_bytes, dense_bytes)` gives the topology with
    the reserved HBM taken off and the dense bytes per rank the planner should count."""

    def reserve_for(self, topology: Topology, dense_weight_bytes: float,
                    dense_bytes: float) -> Tuple[Topology, float]:
        raise NotImplementedError


def _check_percentage(owner: str, percentage: float) -> float:
    if not 0 <= percentage <= 1:
        raise ValueError(f"{owner}: percentage={percentage!r} must be between 0 and 1 (the fraction of each rank's "
                         "HBM to keep free)")
    return float(percentage)


def _with_hbm(topology: Topology, cap_of: Any) -> Topology:
    return topology.replace(hbm_cap=[int(cap_of(cap)) for cap in topology.hbm_caps()])


class FixedPercentageStorageReservation(StorageReservation):
    """Keep `percentage` of every rank's HBM free of tables."""

    def __init__(self, percentage: float) -> None:
        self._percentage = _check_percentage("FixedPercentageStorageReservation", percentage)

    def reserve_for(self, topology: Topology, dense_weight_bytes: float,
                    dense_bytes: float) -> Tuple[Topology, float]:
        return _with_hbm(topology, lambda cap: (1 - self._percentage) * cap), dense_bytes


class FixedAbsoluteStorageReservation(FixedPercentageStorageReservation):
    """Keep `hbm_reserved_bytes` of every rank's HBM free of tables."""

    def __init__(self, hbm_reserved_bytes: int) -> None:
        if hbm_reserved_bytes < 0:
            raise ValueError(f"FixedAbsoluteStorageReservation: hbm_reserved_bytes={hbm_reserved_bytes!r} must be >= 0")
        super().__init__(0.0)
        self._hbm_reserved_bytes = int(hbm_reserved_bytes)

    @classmethod
    def from_gb(cls, hbm_reserved_gb: float) -> "FixedAbsoluteStorageReservation":
        return cls(int(hbm_reserved_gb * 1024 ** 3))

    def reserve_for(self, topology: Topology, dense_weight_bytes: float,
                    dense_bytes: float) -> Tuple[Topology, float]:
        return _with_hbm(topology, lambda cap: max(0, cap - self._hbm_reserved_bytes)), dense_bytes


class HeuristicalStorageReservation(StorageReservation):
    """Keep `percentage` of HBM free, and count the dense part at `parameter_multiplier` x its parameter bytes
    (or `dense_tensor_estimate` bytes)."""

    def __init__(self, percentage: float, parameter_multiplier: float = 6.0,
                 dense_tensor_estimate: Optional[int] = None) -> None:
        self._percentage = _check_percentage("HeuristicalStorageReservation", percentage)
        if parameter_multiplier < 0:
            raise ValueError(f"HeuristicalStorageReservation: parameter_multiplier={parameter_multiplier!r} must be "
                             ">= 0")
        self._parameter_multiplier = float(parameter_multiplier)
        self._dense_tensor_estimate = dense_tensor_estimate

    def reserve_for(self, topology: Topology, dense_weight_bytes: float,
                    dense_bytes: float) -> Tuple[Topology, float]:
        dense = self._dense_tensor_estimate or dense_weight_bytes * self._parameter_multiplier
        return _with_hbm(topology, lambda cap: (1 - self._percentage) * cap), float(dense)
