"""Machine load: how much longer a step takes right now than on the quiet machine the profile describes.

The calibration (rectoolkit.planner.calibrate) fits every time term from the fastest of several repeats, so a
profile prices a plan on a machine of its own: that is what ranks plans, and it holds under load (the plans'
order stays). A step measured while other work runs on the same cores takes longer by a factor that depends on
the machine, not on the plan. This module measures that factor before any plan runs, with a synthetic step that
has the shape of a sharded step (memory-bound gathers between small collectives, every rank waiting for the
slowest at each one):

    factor = median over steps of the slowest rank's wall time / median over steps of its CPU time

how much longer the ranks take than they work: on a machine of their own they wait only at the collectives (a
factor a little above 1); when other work shares the cores, they also wait to be scheduled, at every step and at
every collective. The probe then runs the same step with rank 0 working alone (the others only join the
collectives): `factor_alone`, the slowdown of a plan whose other ranks mostly wait. Other work competes for the
cores with every busy rank, so a plan that leaves ranks idle leaves cores to its busy one (on the 2-core machine
under one busy loop: factor 2.1, factor_alone 1.2-1.3); the cost model interpolates between the two by how busy a
plan keeps the other ranks (rectoolkit.planner.step_time.step_at_load). The profile's terms are CPU times of the fastest repeats, which such waiting does not stretch, so
the estimate times the factor is the wall time to expect now. `CostModel` multiplies its step estimate by
`Topology.load_factor` and `load_factor_alone` (`StepTime.load_ms` is the part load adds; `Topology.at_load(probe)`
sets both), `measure_plans` probes before its first timed
step and between the plans' blocks and reports the estimate at those loads beside the quiet one, and
`rectoolkit.planner.measure.probe_load(world_size)` measures it on its own workers (this module
needs an initialized process group, which the measure layer's launcher provides):

    >>> probe = LoadProbe(factor=1.3, quiet_ms=8.0, median_ms=13.0, reference_ms=10.0, steps=40, world_size=2,
    ...                   load_average=(2.5, 2.0, 1.5), cores=2, factor_alone=1.1)
    >>> probe.factor, str(probe)
    (1.3, 'load factor 1.30, 1.10 with one rank working (synthetic step 13.0 ms wall for 10.0 ms of work; 2 ranks, 40 steps, load average 2.5, 2 cores)')
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Tuple

import torch

PROBE_STEPS = 40  # synthetic steps at least: enough that the median sees the machine's scheduling
PROBE_SECONDS = 1.5  # and at least this long
PROBE_MAX_STEPS = 1000
PROBE_WARMUP = 3
PROBE_CHUNK = 5  # steps per block when the probe alternates all ranks working and one rank working
PROBE_SEGMENTS = 4  # gathers per step, a small all-reduce after each (real steps synchronize 4-12 times)
PROBE_ROWS, PROBE_DIM, PROBE_IDS = 65536, 64, 196608  # a 16 MiB table; 48 MiB of rows read per segment
PROBE_BAGS = 4096  # pooled into this many bags (a small output: no large allocation per step)


@dataclass(frozen=True)
class LoadProbe:
    """One measurement of the machine's load factor (see the module docstring)."""

    factor: float  # median slowest-rank wall time of a synthetic step / reference_ms (its median CPU time)
    quiet_ms: float  # the synthetic step's CPU time on its quietest step (the slowest rank's)
    median_ms: float  # its median wall time (the slowest rank's)
    reference_ms: float  # what the median is divided by: the median CPU time (the work), unless given
    steps: int
    world_size: int
    load_average: Tuple[float, float, float]  # os.getloadavg() when the probe ended
    cores: Optional[int]
    # the same ratio with rank 0 working alone, the other ranks only joining the collectives (None: not measured;
    # with one rank it is `factor`)
    factor_alone: Optional[float] = None

    def __str__(self) -> str:
        alone = f", {self.factor_alone:.2f} with one rank working" if self.factor_alone is not None else ""
        return (f"load factor {self.factor:.2f}{alone} (synthetic step {self.median_ms:.1f} ms wall for "
                f"{self.reference_ms:.1f} ms of work; {self.world_size} ranks, {self.steps} steps, load average "
                f"{self.load_average[0]:.1f}, {self.cores} cores)")

    def to_dict(self) -> Dict[str, Any]:
        """Plain numbers and lists (JSON round trips it unchanged)."""
        fields = asdict(self)
        fields["load_average"] = list(self.load_average)
        return fields


def load_factors(probe: Any) -> Tuple[float, float]:
    """(factor, factor_alone) of a LoadProbe or its dict: what other work adds; a probe measured before factor_alone
    existed has 1.0 for it, the cost model's assumption then.

    A probe of more ranks than cores (`world_size` over `cores`, both in the probe) finds its ranks waiting for cores
    on a quiet machine too; the cost model prices that itself (StepTime.shared_cores_ms), so the all-busy factor is
    taken over that oversubscription, at least 1 (the working rank of factor_alone has a core: kept as measured).

    >>> load_factors({"factor": 2.0}), load_factors({"factor": 2.0, "factor_alone": 1.3})
    ((2.0, 1.0), (2.0, 1.3))
    >>> load_factors({"factor": 2.4, "factor_alone": 1.2, "world_size": 4, "cores": 2})  # 4 ranks on 2 cores
    (1.2, 1.2)
    """
    fields = probe if isinstance(probe, dict) else getattr(probe, "__dict__", None)
    if not isinstance(fields, dict) or "factor" not in fields:
        raise TypeError(f"expected a LoadProbe (rectoolkit.planner.probe_load) or its dict, got {type(probe).__name__}")
    alone = fields.get("factor_alone")
    factor = float(fields["factor"])
    ranks, cores = fields.get("world_size"), fields.get("cores")
    if isinstance(ranks, int) and isinstance(cores, int) and cores > 0 and ranks > cores:
        factor = max(1.0, factor * cores / ranks)
    return factor, 1.0 if alone is None else float(alone)


class SyntheticStep:
    """The probe's step on this rank (every rank of the group runs it together): PROBE_SEGMENTS pooled
    lookups of PROBE_IDS rows from a 16 MiB table, a one-number all-reduce after each. `run` times some of them; `probe`
    turns every step timed so far into a LoadProbe. `alone`: only the group's rank 0 looks up, the others only join
    the all-reduces."""

    def __init__(self, group: Any = None, alone: bool = False) -> None:
        import torch.distributed as dist

        generator = torch.Generator().manual_seed(0)
        self.group = group
        self.works = not alone or dist.get_rank(group) == 0
        # a rank that only joins the all-reduces holds no table (its 16 MiB would crowd the working rank's caches)
        self.table = torch.rand(PROBE_ROWS if self.works else 0, PROBE_DIM, generator=generator)
        self.ids = torch.randint(0, PROBE_ROWS, (PROBE_SEGMENTS, PROBE_IDS), generator=generator)
        self.offsets = torch.arange(0, PROBE_IDS, PROBE_IDS // PROBE_BAGS)  # pooled bags, as a lookup makes
        self.flag = torch.zeros(1)
        self.rows: list = []  # (wall ms, CPU ms) of every timed step on this rank
        for _ in range(PROBE_WARMUP):  # untimed: first touch of the table, the allocator, the caches
            self._step()

    def _step(self) -> None:
        import torch.distributed as dist

        for segment in self.ids:
            if self.works:
                self.flag += torch.nn.functional.embedding_bag(segment, self.table, self.offsets, mode="sum").sum()
            dist.all_reduce(self.flag, group=self.group)
            self.flag.zero_()

    def run(self, steps: int, min_seconds: float = 0.0) -> None:
        """Time at least `steps` steps, for at least `min_seconds` (rank 0's clock decides when all stop)."""
        import torch.distributed as dist

        started, go_on, done = time.perf_counter(), torch.ones(1), 0
        while go_on.item():
            dist.barrier(group=self.group)
            wall, cpu = time.perf_counter(), time.thread_time()
            self._step()
            self.rows.append((1000 * (time.perf_counter() - wall), 1000 * (time.thread_time() - cpu)))
            done += 1
            go_on.fill_(float(done < PROBE_MAX_STEPS and (done < steps or time.perf_counter() - started < min_seconds)))
            dist.broadcast(go_on, src=dist.get_global_rank(self.group, 0) if self.group is not None else 0,
                           group=self.group)

    def probe(self, reference_ms: Optional[float] = None, alone: Optional["SyntheticStep"] = None) -> LoadProbe:
        """The LoadProbe of every step timed so far (a collective: every rank calls it); `alone`: the SyntheticStep
        that ran with one rank working, for `factor_alone`."""
        import torch.distributed as dist

        if reference_ms is not None and not reference_ms > 0:
            raise ValueError(f"measure_load: reference_ms must be positive, got {reference_ms!r}")
        times = self._slowest()
        quiet = float(times[:, 1].min())
        median = float(times[:, 0].median())
        reference = float(times[:, 1].median()) if reference_ms is None else float(reference_ms)
        factor = round(median / reference, 4)
        world_size = dist.get_world_size(self.group)
        factor_alone = factor if world_size == 1 else None
        if alone is not None and alone.rows:
            alone_times = alone._slowest()  # the working rank's wall (the others wait in the collectives) and CPU
            factor_alone = round(float(alone_times[:, 0].median() / alone_times[:, 1].median()), 4)
        return LoadProbe(factor=factor, quiet_ms=round(quiet, 3), median_ms=round(median, 3),
                         reference_ms=round(reference, 3), steps=len(self.rows), world_size=world_size,
                         load_average=_load_average(), cores=os.cpu_count(), factor_alone=factor_alone)

    def _slowest(self) -> torch.Tensor:
        """(wall ms, CPU ms) of every timed step, each the largest over the ranks (a collective)."""
        import torch.distributed as dist

        times = torch.tensor(self.rows, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.group)
        return times


def measure_load(steps: int = PROBE_STEPS, group: Any = None, reference_ms: Optional[float] = None,
                 min_seconds: float = PROBE_SECONDS) -> LoadProbe:
    """The load factor, measured on every rank of an initialized gloo process group at once (each rank must call
    it; all get the same LoadProbe). Runs the synthetic step at least `steps` times and for at least
    `min_seconds` (a burst of load then moves the median less), about 13 ms a step on a quiet core; with more than
    one rank, as many again with rank 0 working alone (`factor_alone`), in alternating blocks of PROBE_CHUNK steps.

    `reference_ms`: what to divide the median wall time by instead of the median CPU time."""
    import torch.distributed as dist

    if not isinstance(steps, int) or steps < 3:
        raise ValueError(f"measure_load: steps must be an int >= 3, got {steps!r}")
    synthetic = SyntheticStep(group)
    if dist.get_world_size(group) == 1:
        synthetic.run(steps, min_seconds)
        return synthetic.probe(reference_ms)
    alone = SyntheticStep(group, alone=True)
    started, rounds = time.perf_counter(), -(-steps // PROBE_CHUNK)
    go_on, done = torch.ones(1), 0
    while go_on.item():  # alternate blocks of the two, so that a change of load hits both alike
        synthetic.run(PROBE_CHUNK)
        alone.run(PROBE_CHUNK)
        done += 1
        go_on.fill_(float(done < PROBE_MAX_STEPS // PROBE_CHUNK
                           and (done < rounds or time.perf_counter() - started < 2 * min_seconds)))
        dist.broadcast(go_on, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    return synthetic.probe(reference_ms, alone)


def _load_average() -> Tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]
    except OSError:  # not on every platform
        return (float("nan"),) * 3  # type: ignore[return-value]
