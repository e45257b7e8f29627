"""The machines a plan runs on: ranks, hosts, memory capacities and bandwidths (TorchRec's field names).

Units follow TorchRec so its code ports unchanged: capacities in bytes, bandwidths in bytes per
millisecond. Estimated times are in milliseconds.

    >>> topo = Topology(world_size=4, compute_device="cuda", local_world_size=2, hbm_cap=16 * 1024**3)
    >>> topo.num_hosts, topo.host_of(3)
    (2, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence, Union

GIB = 1024 ** 3

# TorchRec's defaults (torchrec/distributed/planner/constants.py), bytes per millisecond.
HBM_CAP = 32 * GIB
DDR_CAP = 128 * GIB
HBM_MEM_BW = 897 * GIB / 1000
DDR_MEM_BW = 51 * GIB / 1000
HBM_TO_DDR_MEM_BW = 32 * GIB / 1000
INTRA_NODE_BANDWIDTH = 600 * GIB / 1000
CROSS_NODE_BANDWIDTH = 12.5 * GIB / 1000
BATCH_SIZE = 512
BWD_COMPUTE_MULTIPLIER = 2.0
WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER = 1.0

Capacity = Union[int, float, Sequence[Union[int, float]]]


@dataclass
class Topology:
    """World size, ranks per host, per-rank memory and the bandwidths the cost model uses.

    Args:
        world_size: number of ranks.
        compute_device: "cuda" (tables in HBM, UVM kernels available) or "cpu" (tables in host memory).
        hbm_cap: device memory per rank in bytes (a number, or one per rank). On "cpu" it is unused.
        ddr_cap: host memory per rank in bytes (a number, or one per rank).
        local_world_size: ranks per host (default: all ranks on one host). host = rank // local_world_size.
        batch_size: samples per rank per step (TorchRec passes it to the planner; both work here).
        hbm_mem_bw, ddr_mem_bw, hbm_to_ddr_mem_bw: memory bandwidths, bytes/ms (UVM reads use hbm_to_ddr).
        intra_host_bw, inter_host_bw: bytes/ms one rank moves (sent plus received) over each link class.
        bwd_compute_multiplier: backward lookup time as a multiple of forward.
    """

    world_size: int
    compute_device: str = "cuda"
    hbm_cap: Optional[Capacity] = None
    ddr_cap: Optional[Capacity] = None
    local_world_size: Optional[int] = None
    hbm_mem_bw: float = HBM_MEM_BW
    ddr_mem_bw: float = DDR_MEM_BW
    hbm_to_ddr_mem_bw: float = HBM_TO_DDR_MEM_BW
    intra_host_bw: float = INTRA_NODE_BANDWIDTH
    inter_host_bw: float = CROSS_NODE_BANDWIDTH
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    batch_size: int = BATCH_SIZE
    calibrated: dict = field(default_factory=dict)  # what calibrate() measured, for the record

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size <= 0:
            raise ValueError(f"Topology: world_size must be a positive int, got {self.world_size!r}")
        self.compute_device = str(self.compute_device)
        if self.compute_device not in ("cuda", "cpu", "mtia"):
            raise ValueError(f"Topology: compute_device must be 'cuda' or 'cpu', got {self.compute_device!r}")
        if self.local_world_size is None:
            self.local_world_size = self.world_size
        if self.local_world_size <= 0 or self.world_size % self.local_world_size:
            raise ValueError(
                f"Topology: world_size {self.world_size} must be a multiple of local_world_size "
                f"{self.local_world_size} (ranks per host)"
            )
        if self.hbm_cap is None:
            self.hbm_cap = HBM_CAP if self.compute_device == "cuda" else 0
        if self.ddr_cap is None:
            self.ddr_cap = DDR_CAP
        for name in ("hbm_cap", "ddr_cap"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) and len(value) != self.world_size:
                raise ValueError(f"Topology: {name} has {len(value)} entries for world_size {self.world_size}")
        for name in ("hbm_mem_bw", "ddr_mem_bw", "hbm_to_ddr_mem_bw", "intra_host_bw", "inter_host_bw"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Topology: {name} must be positive (bytes/ms), got {getattr(self, name)!r}")
        if not isinstance(self.batch_size, int) or self.batch_size <= 0:
            raise ValueError(f"Topology: batch_size must be a positive int, got {self.batch_size!r}")

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def host_of(self, rank: int) -> int:
        return rank // self.local_world_size

    @property
    def uses_hbm(self) -> bool:
        """Whether shards live in device memory (cuda) or in host memory (cpu)."""
        return self.compute_device != "cpu"

    def hbm_caps(self) -> List[float]:
        """HBM capacity of each rank in bytes (0 on cpu)."""
        if not self.uses_hbm:
            return [0.0] * self.world_size
        return _per_rank(self.hbm_cap, self.world_size)

    def ddr_caps(self) -> List[float]:
        return _per_rank(self.ddr_cap, self.world_size)

    def link_bw(self, src: int, dst: int) -> float:
        """Bytes/ms between two ranks: intra-host if they share a host, else inter-host."""
        return self.intra_host_bw if self.host_of(src) == self.host_of(dst) else self.inter_host_bw

    def with_batch_size(self, batch_size: int) -> "Topology":
        return replace(self, batch_size=int(batch_size))

    @classmethod
    def calibrate(cls, world_size: int = 2, local_world_size: Optional[int] = None, compute_device: str = "cpu",
                  seconds: float = 3.0, measure_collectives: bool = True, **kwargs) -> "Topology":
        """A Topology with this machine's measured bandwidths (memory, and gloo all-to-all between processes).

        Memory bandwidth: a gather of random rows (what a lookup does), timed with torch. Collective
        bandwidth: `world_size` local processes run gloo all-to-alls; bytes (sent + received) per rank per
        ms become both intra_host_bw and inter_host_bw (this machine is one host). Takes a few seconds.
        """
        from rectoolkit.planner.calibrate import measure_collective_bandwidth, measure_memory_bandwidth

        memory_bw = measure_memory_bandwidth(seconds=seconds / 3)
        measured = {"memory_bw_bytes_per_ms": memory_bw}
        comm_bw = None
        if measure_collectives and world_size > 1:
            comm_bw = measure_collective_bandwidth(world_size, seconds=2 * seconds / 3)
            measured["alltoall_bw_bytes_per_ms"] = comm_bw
        fields = dict(world_size=world_size, compute_device=compute_device, local_world_size=local_world_size,
                      hbm_mem_bw=memory_bw, ddr_mem_bw=memory_bw, hbm_to_ddr_mem_bw=memory_bw)
        if comm_bw is not None:
            fields.update(intra_host_bw=comm_bw, inter_host_bw=comm_bw)
        fields.update(kwargs)
        return cls(calibrated=measured, **fields)


def _per_rank(value: Capacity, world_size: int) -> List[float]:
    if isinstance(value, (int, float)):
        return [float(value)] * world_size
    return [float(v) for v in value]

