"""The machines a plan runs on: ranks, hosts, memory capacities and bandwidths (TorchRec's field names).

Units follow TorchRec so its code ports unchanged: capacities in bytes, bandwidths in bytes per
millisecond. Estimated times are in milliseconds.

    >>> topo = Topology(world_size=4, compute_device="cuda", local_world_size=2, hbm_cap=16 * 1024**3)
    >>> topo.num_hosts, topo.host_of(3)
    (2, 1)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import List, Optional, Sequence, Union

from rectoolkit.planner.hardware import DeviceHardware, Perf, Storage
from rectoolkit.planner.load import load_factors
from rectoolkit.planner.profile import CalibrationProfile, load_profile

GIB = 1024 ** 3

# TorchRec's defaults (torchrec/distributed/planner/constants.py), bytes per millisecond.
HBM_CAP = 32 * GIB
DDR_CAP = 128 * GIB
SSD_CAP = 2 * 1024 * GIB
HBM_MEM_BW = 897 * GIB / 1000
DDR_MEM_BW = 51 * GIB / 1000
HBM_TO_DDR_MEM_BW = 32 * GIB / 1000
SSD_MEM_BW = 100 * 1024 ** 2 / 1000
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
        ssd_cap, ssd_mem_bw: TorchRec's SSD tier, kept as given; no table is placed there (no key-value kernel).
        local_world_size: ranks per host (default: all ranks on one host). host = rank // local_world_size.
        pod_size: None or 1 (TorchRec's hosts per pod; larger pods are refused: collectives are priced per host).
        custom_topology_data, uneven_sharding_perf_multiplier, generalized_comms_bandwidths: TorchRec's; refused
            unless left at their defaults (per-rank capacities go in hbm_cap / ddr_cap as lists).
        created_by_factory: TorchRec's flag, kept.
        batch_size: samples per rank per step (TorchRec passes it to the planner; both work here).
        hbm_mem_bw, ddr_mem_bw, hbm_to_ddr_mem_bw: memory bandwidths, bytes/ms (UVM reads use hbm_to_ddr).
        intra_host_bw, inter_host_bw: bytes/ms one rank moves (sent plus received) over each link class.
        bwd_compute_multiplier: backward lookup time as a multiple of forward (used without a profile).
        profile: a CalibrationProfile (or the path of its JSON, or "default": where `python -m
            rectoolkit.planner.calibrate` writes) with this machine's measured time terms; the cost
            model then prices latencies, fixed costs and cache effects from it (rectoolkit.planner.profile).
            Without one, times are TorchRec's bytes-over-bandwidth from the fields above.
        cores_per_host: CPU cores of a host, when ranks are processes sharing them (the cost model lets at most
            this many local ranks compute at once); None: every rank has its own.
        load_factor: how much longer steps take now than the ranks' work, because other work shares the cores
            (rectoolkit.planner.load; `rectoolkit.planner.probe_load(world_size).factor`); the step estimate is multiplied by it
            (1.0: the estimate as calibrated). It never changes which plan is fastest, only the times shown.
        load_factor_alone: the same with one rank working and the other local ranks waiting
            (`probe.factor_alone`); a plan whose ranks are unequally busy is priced between the two
            (step_time.step_at_load). Default 1.0: such a plan gets none of the load. `topology.at_load(probe)` sets both.

    `devices` is TorchRec's list of DeviceHardware, one per rank (rectoolkit.planner.hardware): each rank's capacities
    in bytes (hbm 0 on "cpu"; ssd 2 TiB unless ssd_cap is given, as TorchRec) and a zero Perf. The planner reads the
    capacities from there, so editing `topology.devices[1].storage.hbm` plans for it, as in TorchRec.

        >>> Topology(world_size=2, compute_device="cpu", ddr_cap=[8, 16]).devices[1].storage
        Storage(hbm=0, ddr=16, ssd=2199023255552)
    """

    world_size: int
    compute_device: str = "cuda"
    hbm_cap: Optional[Capacity] = None
    ddr_cap: Optional[Capacity] = None
    ssd_cap: Optional[Capacity] = None
    local_world_size: Optional[int] = None
    pod_size: Optional[int] = None
    hbm_mem_bw: float = HBM_MEM_BW
    ddr_mem_bw: float = DDR_MEM_BW
    ssd_mem_bw: float = SSD_MEM_BW
    hbm_to_ddr_mem_bw: float = HBM_TO_DDR_MEM_BW
    intra_host_bw: float = INTRA_NODE_BANDWIDTH
    inter_host_bw: float = CROSS_NODE_BANDWIDTH
    bwd_compute_multiplier: float = BWD_COMPUTE_MULTIPLIER
    custom_topology_data: Optional[object] = None
    weighted_feature_bwd_compute_multiplier: float = WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER
    uneven_sharding_perf_multiplier: float = 1.0
    generalized_comms_bandwidths: Optional[object] = None
    created_by_factory: bool = False
    # rectoolkit's own fields, after TorchRec's so that its positional calls mean the same here
    batch_size: int = BATCH_SIZE
    profile: Union[None, str, Path, CalibrationProfile] = None
    cores_per_host: Optional[int] = None
    load_factor: float = 1.0
    load_factor_alone: float = 1.0
    devices: List[DeviceHardware] = field(init=False, repr=False, compare=False)

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
        self._refuse_what_the_model_cannot_price()
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
        self.profile = load_profile(self.profile)
        if self.cores_per_host is not None and (not isinstance(self.cores_per_host, int) or self.cores_per_host <= 0):
            raise ValueError(f"Topology: cores_per_host must be a positive int or None, got {self.cores_per_host!r}")
        for name in ("load_factor", "load_factor_alone"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < float("inf"):
                raise ValueError(f"Topology: {name} must be a positive number (1.0: the estimate as calibrated; "
                                 f"rectoolkit.planner.probe_load measures it), got {value!r}")
            setattr(self, name, float(value))
        if not isinstance(self.batch_size, int) or self.batch_size <= 0:
            raise ValueError(f"Topology: batch_size must be a positive int, got {self.batch_size!r}")
        hbm = _per_rank(self.hbm_cap, self.world_size) if self.uses_hbm else [0] * self.world_size
        ddr = _per_rank(self.ddr_cap, self.world_size)
        ssd = _per_rank(self.ssd_cap if self.ssd_cap is not None else SSD_CAP, self.world_size)
        self.devices = [DeviceHardware(rank, Storage(hbm=int(hbm[rank]), ddr=int(ddr[rank]), ssd=int(ssd[rank])),
                                       Perf(fwd_compute=0, fwd_comms=0, bwd_compute=0, bwd_comms=0))
                        for rank in range(self.world_size)]

    def _refuse_what_the_model_cannot_price(self) -> None:
        """TorchRec's fields that change its plans but have no counterpart in this cost model are refused by name
        (ssd_cap and ssd_mem_bw are kept: no table is placed on SSD here, there being no key-value kernel)."""
        if self.pod_size is not None:
            if not isinstance(self.pod_size, int) or self.pod_size <= 0:
                raise ValueError(f"Topology: pod_size must be a positive int or None, got {self.pod_size!r}")
            if self.pod_size > self.world_size:
                raise ValueError(f"Topology: pod_size={self.pod_size} cannot be greater than world_size={self.world_size}")
            if self.pod_size != 1:
                raise NotImplementedError(
                    f"Topology: pod_size={self.pod_size} (hosts per pod, priced by TorchRec's generalized comms) is not "
                    "priced here: collectives are priced per host (intra_host_bw) and across hosts (inter_host_bw); "
                    "leave pod_size None (or 1)")
        refused = {"custom_topology_data": (self.custom_topology_data is not None,
                                            "pass per-rank capacities as lists: hbm_cap=[...], ddr_cap=[...]"),
                   "uneven_sharding_perf_multiplier": (self.uneven_sharding_perf_multiplier != 1.0,
                                                       "the cost model prices each shard by its own size; leave it 1.0"),
                   "generalized_comms_bandwidths": (self.generalized_comms_bandwidths is not None,
                                                    "set intra_host_bw / inter_host_bw, or calibrate a profile "
                                                    "(Topology.calibrate()) for fitted per-collective terms")}
        for name, (given, fix) in refused.items():
            if given:
                raise NotImplementedError(f"Topology: {name}={getattr(self, name)!r} is not supported here: {fix}")
        if not self.ssd_mem_bw > 0:
            raise ValueError(f"Topology: ssd_mem_bw must be positive (bytes/ms), got {self.ssd_mem_bw!r}")

    def at_load(self, probe) -> "Topology":
        """This topology with the load a LoadProbe measured (rectoolkit.planner.probe_load, or the probe's dict):
        load_factor = probe.factor, load_factor_alone = probe.factor_alone (1.0 where the probe has none); a probe of
        more ranks than cores has its factor taken over that oversubscription (rectoolkit.planner.load.load_factors).

            >>> from rectoolkit.planner.load import LoadProbe
            >>> probe = LoadProbe(2.0, 8.0, 20.0, 10.0, 40, 2, (1.0, 1.0, 1.0), 2, factor_alone=1.25)
            >>> topology = Topology(world_size=2, compute_device="cpu").at_load(probe)
            >>> topology.load_factor, topology.load_factor_alone
            (2.0, 1.25)
        """
        try:
            factor, alone = load_factors(probe)
        except TypeError as error:
            raise TypeError(f"Topology.at_load: {error}") from None
        return self.replace(load_factor=factor, load_factor_alone=alone)

    def replace(self, **changes) -> "Topology":
        """dataclasses.replace, keeping the devices as edited (`devices[r].storage`, `.perf`) where `changes` does
        not set their capacity (hbm_cap, ddr_cap, ssd_cap)."""
        new = replace(self, **changes)
        if new.world_size == self.world_size:
            for mine, theirs in zip(self.devices, new.devices):
                theirs.storage = Storage(*(getattr(theirs.storage if f"{tier}_cap" in changes else mine.storage, tier)
                                           for tier in ("hbm", "ddr", "ssd")))
                theirs.perf = copy.copy(mine.perf)
        return new

    @property
    def intra_group_size(self) -> int:
        """TorchRec's: the ranks of one pod (pod_size hosts), or of one host when pod_size is None."""
        return self.local_world_size * (self.pod_size or 1)

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
        """HBM capacity of each rank in bytes (0 on cpu), from `devices`."""
        return [float(device.storage.hbm) for device in self.devices]

    def ddr_caps(self) -> List[float]:
        """Host memory of each rank in bytes, from `devices`."""
        return [float(device.storage.ddr) for device in self.devices]

    def link_bw(self, src: int, dst: int) -> float:
        """Bytes/ms between two ranks: intra-host if they share a host, else inter-host."""
        return self.intra_host_bw if self.host_of(src) == self.host_of(dst) else self.inter_host_bw

    def with_batch_size(self, batch_size: int) -> "Topology":
        return self.replace(batch_size=int(batch_size))

    @property
    def time_profile(self) -> CalibrationProfile:
        """The profile the cost model prices time with: the measured one, else TorchRec's bandwidth-only terms."""
        return self.profile if self.profile is not None else CalibrationProfile.from_topology(self)

    @classmethod
    def calibrate(cls, world_size: int = 2, local_world_size: Optional[int] = None, compute_device: str = "cpu",
                  out: Union[None, str, Path] = None, quick: bool = False, **kwargs) -> "Topology":
        """A Topology carrying this machine's measured CalibrationProfile (rectoolkit.planner.calibrate).

        Runs short micro-benchmarks of rectoolkit's own kernels and collectives on `world_size` local worker
        processes (gloo on CPU, NCCL with CUDA), under a minute. `out`: also save the profile as JSON there.
        From a script, call it under `if __name__ == "__main__":` (the workers are spawned processes).
        """
        from rectoolkit.planner.calibrate import calibrate_profile

        profile = calibrate_profile(world_size, compute_device=compute_device, quick=quick)
        if out is not None:
            profile.save(out)
        return cls.from_profile(profile, world_size, local_world_size, compute_device, **kwargs)

    @classmethod
    def from_profile(cls, profile: Union[str, Path, CalibrationProfile], world_size: int = 2,
                     local_world_size: Optional[int] = None, compute_device: str = "cpu", **kwargs) -> "Topology":
        """A Topology of `world_size` local ranks carrying `profile` (a CalibrationProfile or its JSON's path), with
        cores_per_host taken from where the profile was measured unless given."""
        if profile is None:
            raise ValueError("Topology.from_profile: profile is None; give a CalibrationProfile, the path of its JSON or "
                             "\"default\" (or build Topology(...) without a profile)")
        profile = load_profile(profile)
        local = local_world_size if local_world_size is not None else world_size
        fields = dict(world_size=world_size, compute_device=compute_device, local_world_size=local)
        fields.update(kwargs)
        cores = profile.machine.get("cores")
        if "cores_per_host" not in fields and isinstance(cores, int):
            fields["cores_per_host"] = cores
        return cls(profile=profile, **fields)


def _per_rank(value: Capacity, world_size: int) -> List[float]:
    if isinstance(value, (int, float)):
        return [float(value)] * world_size
    return [float(v) for v in value]

