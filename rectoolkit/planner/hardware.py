"""TorchRec's description of one rank's hardware: `Topology.devices` is a list of DeviceHardware, one per rank, each with
its Storage (bytes of HBM, DDR and SSD) and a Perf (TorchRec's planner adds the estimated time of the shards placed
there; it starts at zero). rectoolkit's planner reads the capacities from them, so an edited
`topology.devices[r].storage.hbm` is planned for.

    >>> Storage(hbm=4, ddr=8) + Storage(hbm=1, ddr=2, ssd=3)
    Storage(hbm=5, ddr=10, ssd=3)
    >>> Perf(fwd_compute=1.0, fwd_comms=2.0, bwd_compute=3.0, bwd_comms=4.0).total
    10.0
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(order=True)
class Storage:
    """Bytes of each memory tier (TorchRec's torchrec.distributed.planner.types.Storage)."""

    hbm: int
    ddr: int
    ssd: int = 0

    def __add__(self, other: "Storage") -> "Storage":
        return Storage(hbm=self.hbm + other.hbm, ddr=self.ddr + other.ddr, ssd=self.ssd + other.ssd)

    def __sub__(self, other: "Storage") -> "Storage":
        return Storage(hbm=self.hbm - other.hbm, ddr=self.ddr - other.ddr, ssd=self.ssd - other.ssd)

    def __hash__(self) -> int:
        return hash((self.hbm, self.ddr, self.ssd))

    def fits_in(self, other: "Storage") -> bool:
        return self.hbm <= other.hbm and self.ddr <= other.ddr and self.ssd <= other.ssd


@dataclass
class Perf:
    """Estimated milliseconds of each part of a step (TorchRec's torchrec.distributed.planner.types.Perf)."""

    fwd_compute: float
    fwd_comms: float
    bwd_compute: float
    bwd_comms: float
    input_dist_comms: float = 0.0
    prefetch_compute: float = 0.0

    @property
    def total(self) -> float:
        """TorchRec's sum: compute and comms of both passes, and prefetch (input_dist_comms is not in it)."""
        return self.fwd_compute + self.bwd_compute + self.fwd_comms + self.bwd_comms + self.prefetch_compute

    def __add__(self, other: "Perf") -> "Perf":
        return Perf(*(a + b for a, b in zip(self._values(), other._values())))

    def _values(self) -> tuple:
        return (self.fwd_compute, self.fwd_comms, self.bwd_compute, self.bwd_comms, self.input_dist_comms,
                self.prefetch_compute)

    def __hash__(self) -> int:
        return hash(self._values())


@dataclass
class DeviceHardware:
    """One rank: its number, memory and estimated time (TorchRec's torchrec.distributed.planner.types.DeviceHardware)."""

    rank: int
    storage: Storage
    perf: Perf

    def __hash__(self) -> int:
        return hash((self.rank, self.storage, self.perf))
