"""A calibration profile: the measured terms of the cost model for one machine, saved as JSON.

Every time term the planner uses comes from here (rectoolkit.planner.cost reads it; `explain()` and the report
show it). A profile is measured by `python -m rectoolkit.planner.calibrate` (or `Topology.calibrate()`); without
one the planner uses `CalibrationProfile.from_topology`, TorchRec's bandwidth-only defaults with zero fixed costs.

The terms (all times in ms, bandwidths in bytes per ms, as TorchRec's Topology):

- collectives: an alpha-beta pair per collective kind ("all_to_all", "all_reduce", "reduce_scatter",
  "all_gather"), each fitted from its own timings: a call costs `alpha_ms + bytes / bytes_per_ms`, bytes being what
  one rank sends plus receives over the call. Which pair prices which of the engine's collectives is one table,
  rectoolkit.planner.cost.FITTED_COLLECTIVE. A profile calibrated before reduce-scatter and all-gather were fitted
  holds only the first two; it still loads, and all_reduce's pair stands in for the missing ones (a ring all-reduce
  is a reduce-scatter then an all-gather over the same links; `missing_collectives` and `describe()` say so).
- lookups: one pass over a shard's ids costs `ids x id_ms + rows read x row bytes x read_factor x read ms per
  byte + output bytes x output_ms_per_byte` (`LookupTerms`): `forward` for the lookup, `backward[optimizer]` for the
  backward and the fused optimizer update. Rows read (`rows_read`): the distinct rows the ids touch, as uniform ids
  would (`expected_rows_read`): a row read again in the same pass is in cache (a 20,000-row table taking 51,200 ids
  reads 18,454 rows). The read speed depends on the shard's size (its working set): `read_curve` is a list of
  (working set bytes, bytes per ms) points, interpolated in log(size); shards that fit in cache read fast, ones far
  larger than the last-level cache at memory speed. The terms are solved from four timings of a pass (two batches
  at two row widths), so the call's fixed part is left to `shard_ms`. A version-2 profile (saved before rows were
  counted distinct) was fitted with a row read per id and is priced that way (`reads_distinct_rows` False).
- writes: `write_bytes_per_ms`, a large copy's speed (a dense kernel's passes over its whole shard).
- fixed costs: `step_ms` once per step, `group_ms[sharding type]` once per sharding-type group (its Python work,
  and for the types other than table-wise what synchronizing the ranks inside real work costs beyond its calls'
  latency), `shard_ms` once per shard a rank holds (`replica_ms` per data-parallel
  replica: a lookup of its own batch and a whole-table update).
- per id: `id_ms` for every id a shard receives, forward and backward together: the sharded engine's own work per
  id (routing, id checks, offsets, gradient rows) beyond reading and writing rows; `routing_id_ms` more for every
  id of a row-routed group (row_wise, table_row_wise, grid_shard), which buckets ids by row block, once per id for
  its whole row (a grid shard holding part of the columns pays that part).
- sharing: local ranks share a host's cores and memory; when they all work at once they get `memory_parallelism`
  times one rank's speed, not `local ranks` times (1.0: fully serialized, local ranks: no sharing); measured on the
  lookup kernels alone (a heavy lookup on rank 0 against the same on every rank at once).

    >>> from rectoolkit.planner.topology import Topology
    >>> p = CalibrationProfile.from_topology(Topology(world_size=2, compute_device="cpu"))
    >>> p.collective("all_to_all").cost_ms(0.0)
    0.0
    >>> CalibrationProfile.from_json(p.to_json()) == p
    True
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np


PROFILE_VERSION = 3  # 2: per-id / per-byte / per-output lookup terms (LookupTerms); 3: reads per distinct row
READABLE_VERSIONS = (2, 3)
COLLECTIVE_KINDS = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather")
REQUIRED_COLLECTIVES = ("all_to_all", "all_reduce")  # a profile calibrated before the other two were fitted has these
STAND_IN = {"reduce_scatter": "all_reduce", "all_gather": "all_reduce"}  # prices a pair such a profile lacks
BWD_COMPUTE_MULTIPLIER = 2.0  # TorchRec's backward / forward ratio, used where nothing was measured
OPTIMIZERS = ("sgd", "adagrad", "row_wise_adagrad", "adam")  # EmbOptimType values
ROW_ROUTED = ("row_wise", "table_row_wise", "grid_shard")  # groups that bucket ids by row block
SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "grid_shard", "data_parallel")
RUNS_AS = {"table_column_wise": "column_wise"}  # a type that runs another's code costs what that one costs


@dataclass(frozen=True)
class AlphaBeta:
    """One collective kind: a call costs alpha_ms + bytes (sent + received by one rank) / bytes_per_ms."""

    alpha_ms: float
    bytes_per_ms: float

    def cost_ms(self, num_bytes: float) -> float:
        return self.alpha_ms + num_bytes / self.bytes_per_ms if num_bytes or self.alpha_ms else 0.0

    def problem(self) -> Optional[str]:
        """What makes this pair unusable (None: nothing).

        >>> AlphaBeta(0.1, 0.0).problem()
        'bytes_per_ms must be a finite number > 0, got 0.0'
        """
        for name, value, low in (("alpha_ms", self.alpha_ms, ">= 0"), ("bytes_per_ms", self.bytes_per_ms, "> 0")):
            number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not number or value < 0 or (low == "> 0" and value == 0):
                return f"{name} must be a finite number {low}, got {value!r}"
        return None


@dataclass(frozen=True)
class LookupTerms:
    """One pass over a shard's ids, the forward lookup or the backward + optimizer update, in ms:
    ids x id_ms + rows read x row bytes x read_factor x read ms per byte at the shard's size + output bytes x
    output_ms_per_byte, where rows read are the distinct rows the ids touch (CalibrationProfile.rows_read; one per id
    for a profile fitted so, version 2).

    >>> LookupTerms(id_ms=0.001, read_factor=2.0, output_ms_per_byte=1e-6).cost_ms(100, 256, 1e-5, 4096)
    0.616096
    """

    id_ms: float = 0.0
    read_factor: float = 1.0
    output_ms_per_byte: float = 0.0

    def cost_ms(self, ids, row_bytes, read_ms_per_byte, output_bytes, rows_read=None):
        """Numbers or numpy arrays (broadcast). `rows_read`: the distinct rows the ids read (default: one per id)."""
        rows_read = ids if rows_read is None else rows_read
        return (ids * self.id_ms + rows_read * row_bytes * self.read_factor * read_ms_per_byte
                + output_bytes * self.output_ms_per_byte)

    def scaled(self, factor: float) -> "LookupTerms":
        return LookupTerms(self.id_ms * factor, self.read_factor * factor, self.output_ms_per_byte * factor)


def expected_rows_read(ids, rows):
    """The distinct rows `ids` uniform draws from `rows` rows read: rows x (1 - exp(-ids / rows)); numbers or arrays.

    >>> round(float(expected_rows_read(20000, 20000)), 1), float(expected_rows_read(0, 100)), float(expected_rows_read(5, 0))
    (12642.4, 0.0, 0.0)
    """
    rows = np.asarray(rows, dtype=float)
    safe = np.where(rows > 0, rows, 1.0)
    return np.where(rows > 0, safe * -np.expm1(-np.asarray(ids, dtype=float) / safe), 0.0)


@dataclass(frozen=True)
class CalibrationProfile:
    """The cost model's measured terms (see the module docstring). Frozen; JSON via to_json / from_json / save / load."""

    collectives: Dict[str, AlphaBeta]
    read_curve: Tuple[Tuple[float, float], ...]  # (working set bytes, read bytes per ms), working set ascending
    write_bytes_per_ms: float
    forward: LookupTerms = LookupTerms()
    backward_terms: Dict[str, LookupTerms] = field(default_factory=dict)  # optimizer -> backward + update
    step_ms: float = 0.0
    group_ms: Dict[str, float] = field(default_factory=dict)
    shard_ms: float = 0.0
    replica_ms: float = 0.0  # per data-parallel replica, in place of shard_ms
    routed_shard_ms: float = 0.0  # per shard of a row-routed group (row_wise, table_row_wise, grid_shard), in its place
    id_ms: float = 0.0  # the engine's work per id received, for rows id_row_bytes wide (it grows with the width)
    routing_id_ms: float = 0.0  # added per id for row-block routing (row_wise, table_row_wise, grid_shard)
    id_row_bytes: float = 256.0  # the row width id_ms was measured at (the calibration's 64 float32 columns)
    memory_parallelism: float = 1.0
    reads_distinct_rows: bool = True  # rows read = the distinct rows the ids touch (False: one per id, TorchRec's)
    machine: Dict[str, object] = field(default_factory=dict)  # where and how it was measured, for the record

    def __post_init__(self) -> None:
        for kind in REQUIRED_COLLECTIVES:
            if kind not in self.collectives:
                raise ValueError(f"CalibrationProfile: collectives lacks {kind!r}; it needs {REQUIRED_COLLECTIVES} "
                                 f"(and fits {COLLECTIVE_KINDS})")
        unknown = sorted(set(self.collectives) - set(COLLECTIVE_KINDS))
        if unknown:
            raise ValueError(f"CalibrationProfile: collectives has unknown kinds {unknown}; the kinds are "
                             f"{COLLECTIVE_KINDS}")
        for kind, pair in self.collectives.items():
            problem = pair.problem() if isinstance(pair, AlphaBeta) else f"not an AlphaBeta: {pair!r}"
            if problem:
                raise ValueError(f"CalibrationProfile: collective {kind!r}: {problem}")
        if not self.read_curve or any(bw <= 0 or size <= 0 for size, bw in self.read_curve):
            raise ValueError(f"CalibrationProfile: read_curve needs positive (working set, bytes/ms) points, "
                             f"got {self.read_curve!r}")
        if list(self.read_curve) != sorted(self.read_curve):
            raise ValueError("CalibrationProfile: read_curve points must be in ascending working-set order")
        if not self.write_bytes_per_ms > 0:
            raise ValueError(f"CalibrationProfile: write_bytes_per_ms must be positive, got {self.write_bytes_per_ms}")
        unknown = set(self.group_ms) - set(SHARDING_TYPES)
        if unknown:
            raise ValueError(f"CalibrationProfile: group_ms has unknown sharding types {sorted(unknown)}")
        for name, terms in [("forward", self.forward)] + [(f"backward_terms[{k!r}]", v)
                                                          for k, v in self.backward_terms.items()]:
            if min(terms.id_ms, terms.read_factor, terms.output_ms_per_byte) < 0:
                raise ValueError(f"CalibrationProfile: {name} terms must be >= 0, got {terms}")
        if not self.id_row_bytes > 0:
            raise ValueError(f"CalibrationProfile: id_row_bytes must be positive, got {self.id_row_bytes}")
        if self.memory_parallelism < 1.0:
            raise ValueError(f"CalibrationProfile: memory_parallelism must be >= 1, got {self.memory_parallelism}")

    # ---- the terms ----------------------------------------------------------------------------------------------
    def collective(self, kind: str) -> AlphaBeta:
        """The fitted pair of this collective kind; where the profile lacks it, its stand-in's (STAND_IN)."""
        if kind in self.collectives:
            return self.collectives[kind]
        if kind in STAND_IN:
            return self.collectives[STAND_IN[kind]]
        raise KeyError(f"no collective {kind!r} in the profile; the kinds are {COLLECTIVE_KINDS}")

    @property
    def missing_collectives(self) -> Tuple[str, ...]:
        """The collective kinds this profile has no fitted pair for (priced with their STAND_IN's)."""
        return tuple(kind for kind in COLLECTIVE_KINDS if kind not in self.collectives)

    def read_ms_per_byte(self, working_set_bytes):
        """ms per byte read from shards of these sizes (a number or an array): ms/byte is linear in log(size)
        between the measured points, and flat beyond the first and the last."""
        sizes = np.log([size for size, _ in self.read_curve])
        per_byte = [1.0 / bw for _, bw in self.read_curve]
        x = np.log(np.maximum(np.asarray(working_set_bytes, dtype=float), 1.0))
        result = np.interp(x, sizes, per_byte)
        return float(result) if np.ndim(result) == 0 else result

    def id_cost_ms(self, routed, row_bytes=None):
        """ms per id a shard receives, beyond what its lookup terms price (fwd + bwd): the engine's work per id, in
        proportion to the shard's row bytes (a number or an array; default the width it was measured at: a
        column-wise shard of half the width measures about half of it), plus row-block routing, which handles ids
        only, where `routed` (a bool or a bool array: the shard's group buckets ids by row block, ROW_ROUTED; or the
        share of the row a shard of such a group holds, a number or an array: routing is paid once per id for the
        whole row, so a grid shard of half the columns pays half).

        >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1.0),), 1.0,
        ...                        id_ms=0.002, routing_id_ms=0.001)
        >>> p.id_cost_ms(False), p.id_cost_ms(False, 128), p.id_cost_ms(True, 128)  # table-, column-, row-wise
        (0.002, 0.001, 0.002)
        >>> p.id_cost_ms(np.array([False, True]), 128).tolist()
        [0.001, 0.002]
        """
        width = self.id_row_bytes if row_bytes is None else row_bytes
        return self.id_ms * width / self.id_row_bytes + self.routing_id_ms * routed

    def shard_fixed_ms(self, sharding_type: str) -> float:
        """ms per shard of this sharding type a rank holds."""
        if sharding_type == "data_parallel":
            return self.replica_ms
        return self.routed_shard_ms if sharding_type in ROW_ROUTED else self.shard_ms

    def group_fixed_ms(self, sharding_type: str) -> float:
        return float(self.group_ms.get(RUNS_AS.get(sharding_type, sharding_type), 0.0))

    def backward(self, optimizer: str) -> LookupTerms:
        """The backward + fused update's terms for this optimizer (where it was not measured: TorchRec's 2x the
        forward)."""
        if optimizer in self.backward_terms:
            return self.backward_terms[optimizer]
        return self.forward.scaled(BWD_COMPUTE_MULTIPLIER)

    # ---- construction and JSON ------------------------------------------------------------------------------------
    @classmethod
    def from_topology(cls, topology) -> "CalibrationProfile":
        """The bandwidth-only model TorchRec uses: no fixed costs, no cache effect, collectives at the link bandwidth."""
        local = topology.hbm_mem_bw if topology.uses_hbm else topology.ddr_mem_bw
        link = AlphaBeta(0.0, float(topology.intra_host_bw))
        return cls(collectives={kind: link for kind in COLLECTIVE_KINDS}, read_curve=((1.0, float(local)),),
                   write_bytes_per_ms=float(local), forward=LookupTerms(0.0, 1.0, 1.0 / float(local)),
                   backward_terms={name: LookupTerms(0.0, 1.0, 1.0 / float(local)).scaled(
                       float(topology.bwd_compute_multiplier)) for name in OPTIMIZERS},
                   memory_parallelism=float(topology.local_world_size), reads_distinct_rows=False,
                   machine={"source": "topology defaults (not measured)"})

    def to_dict(self) -> dict:
        data = asdict(self)
        data["read_curve"] = [list(point) for point in self.read_curve]
        data["version"] = PROFILE_VERSION
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict, source: str = "profile") -> "CalibrationProfile":
        data = dict(data)
        version = data.pop("version", None)
        if version not in READABLE_VERSIONS:
            raise ValueError(f"{source}: calibration profile version {version!r}, this rectoolkit reads versions "
                             f"{', '.join(map(str, READABLE_VERSIONS))}; re-run `python -m rectoolkit.planner.calibrate`")
        if version == 2:  # fitted with a row read per id: priced so
            data["reads_distinct_rows"] = False
        try:
            data["collectives"] = _collectives_from_json(data["collectives"], source)
            data["read_curve"] = tuple((float(s), float(b)) for s, b in data["read_curve"])
            data["forward"] = LookupTerms(**data["forward"])
            data["backward_terms"] = {k: LookupTerms(**v) for k, v in data["backward_terms"].items()}
            return cls(**data)
        except (KeyError, TypeError) as error:
            raise ValueError(f"{source}: not a calibration profile ({error}); re-run "
                             "`python -m rectoolkit.planner.calibrate`") from None

    @classmethod
    def from_json(cls, text: str, source: str = "profile") -> "CalibrationProfile":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{source}: not valid JSON ({error})") from None
        return cls.from_dict(data, source)

    def save(self, path: Union[str, Path]) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: Union[str, Path]) -> "CalibrationProfile":
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"calibration profile {path} does not exist; make one with "
                                    f"`python -m rectoolkit.planner.calibrate --out {path}`")
        return cls.from_json(path.read_text(), str(path))

    def rows_read(self, ids, rows):
        """The rows a pass of `ids` over a shard of `rows` rows reads: the distinct ones (expected_rows_read), or
        one per id for a profile fitted so (reads_distinct_rows False). Numbers or numpy arrays.

        >>> from dataclasses import replace
        >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1.0),), 1.0)
        >>> round(float(p.rows_read(51200, 20000))), replace(p, reads_distinct_rows=False).rows_read(51200, 20000)
        (18454, 51200)
        """
        return expected_rows_read(ids, rows) if self.reads_distinct_rows else ids

    def summary_rows(self) -> List[Tuple[str, str]]:
        """(term, value) rows for explain(), describe() and the widgets: every fitted collective pair with the
        engine's collectives it prices (or the stand-in a profile without it uses), then the other terms."""
        rows = [(f"{kind}: latency, bandwidth", self._collective_text(kind)) for kind in COLLECTIVE_KINDS]
        rows += [("read speed by shard size", ", ".join(f"{_size(s)}: {bw / 1e6:.2f} GB/s" for s, bw in self.read_curve)),
                 ("rows read per pass", "the distinct rows its ids touch" if self.reads_distinct_rows
                  else "one per id (a version-2 or uncalibrated profile)"),
                 ("forward per id, per output byte", _terms_text(self.forward)),
                 ("large copy (write) speed", f"{self.write_bytes_per_ms / 1e6:.2f} GB/s"),
                 ("fixed per step", f"{self.step_ms:.3f} ms"),
                 ("fixed per shard, per data-parallel replica, per row-routed shard",
                  f"{self.shard_ms:.3f} ms, {self.replica_ms:.3f} ms, {self.routed_shard_ms:.3f} ms"),
                 ("engine work per id received (fwd + bwd)",
                  f"{self.id_ms * 1e3:.3f} us for {self.id_row_bytes:.0f}-byte rows, in proportion to the row bytes"),
                 ("row-block routing per id", f"{self.routing_id_ms * 1e3:.3f} us"),
                 ("fixed per sharding-type group", ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(self.group_ms.items()))
                  or "0 ms"),
                 ("backward + update", "; ".join(f"{k}: {_terms_text(v)}" for k, v in sorted(self.backward_terms.items()))
                  or f"{BWD_COMPUTE_MULTIPLIER:.1f}x the forward (TorchRec's default)"),
                 ("local ranks reading at once", f"{self.memory_parallelism:.2f}x one rank's speed")]
        return rows

    def describe(self) -> str:
        """The profile's terms, one per line (summary_rows), under where it was measured.

        >>> old = CalibrationProfile({"all_to_all": AlphaBeta(0.1, 1e6), "all_reduce": AlphaBeta(0.2, 2e6)},
        ...                          ((1.0, 1e7),), 1e7, machine={"host": "laptop"})
        >>> old.missing_collectives
        ('reduce_scatter', 'all_gather')
        >>> print(old.describe())  # doctest: +ELLIPSIS
        Calibration profile measured on laptop:
          all_to_all: latency, bandwidth: 0.100 ms + bytes / 1.00 GB/s; prices input_dist, output_dist, ...
          all_reduce: latency, bandwidth: 0.200 ms + bytes / 2.00 GB/s; prices dp_allreduce
          reduce_scatter: latency, bandwidth: not fitted (this profile predates it): all_reduce's pair stands in, ...
          all_gather: latency, bandwidth: not fitted ...
          read speed by shard size: 1 B: 10.00 GB/s
        ...
        """
        where = self.machine.get("source") or f"measured on {self.machine.get('host', 'an unnamed machine')}"
        return "\n".join([f"Calibration profile {where}:"] + [f"  {term}: {value}" for term, value in self.summary_rows()])

    def _collective_text(self, kind: str) -> str:
        # the table of which pair prices which engine collective is the cost model's (cost.py imports this module)
        from rectoolkit.planner.cost import FITTED_COLLECTIVE

        pair = self.collective(kind)
        speed = f"{pair.alpha_ms:.3f} ms + bytes / {pair.bytes_per_ms / 1e6:.2f} GB/s"
        users = [name for name, fitted in FITTED_COLLECTIVE.items() if fitted == kind]
        prices = f"prices {', '.join(users)}" if users else "prices no collective the engine issues"
        if kind in self.collectives:
            return f"{speed}; {prices}"
        return (f"not fitted (this profile predates it): {STAND_IN[kind]}'s pair stands in, {speed}; {prices}; "
                "re-run `python -m rectoolkit.planner.calibrate` to fit it")


def _collectives_from_json(collectives: object, source: str) -> Dict[str, AlphaBeta]:
    """The profile's "collectives" object as AlphaBeta pairs; a malformed one is refused naming its key and file."""
    fix = "re-run `python -m rectoolkit.planner.calibrate`"
    if not isinstance(collectives, dict):
        raise ValueError(f"{source}: \"collectives\" must be an object of alpha-beta pairs, got {collectives!r}; {fix}")
    pairs = {}
    for kind, value in collectives.items():
        if kind not in COLLECTIVE_KINDS:
            raise ValueError(f"{source}: collectives[{kind!r}] is not a collective kind ({COLLECTIVE_KINDS}); {fix}")
        if not isinstance(value, dict) or set(value) != {"alpha_ms", "bytes_per_ms"}:
            raise ValueError(f"{source}: collectives[{kind!r}] must be {{\"alpha_ms\": ..., \"bytes_per_ms\": ...}}, "
                             f"got {value!r}; {fix}")
        pair = AlphaBeta(**value)
        problem = pair.problem()
        if problem:
            raise ValueError(f"{source}: collectives[{kind!r}]: {problem}; {fix}")
        pairs[kind] = pair
    lacking = [kind for kind in REQUIRED_COLLECTIVES if kind not in pairs]
    if lacking:
        raise ValueError(f"{source}: collectives lacks {lacking}; every profile has {REQUIRED_COLLECTIVES}; {fix}")
    return pairs


def _terms_text(terms: LookupTerms) -> str:
    return (f"{terms.id_ms * 1e6:.1f} ns per id + row bytes x {terms.read_factor:.2f} x read time + "
            f"{terms.output_ms_per_byte * 1e6:.3f} ns per output byte")


def _size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num_bytes < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.0f} GiB"


def fit_alpha_beta(samples: Sequence[Tuple[float, float]]) -> AlphaBeta:
    """alpha = the time of the smallest message (its bytes cost next to nothing), then the bandwidth that fits the
    larger ones best with that alpha (least squares of ms - alpha = bytes / bandwidth). A fit of both at once lets
    the large messages' noise swing alpha, even below zero.

    >>> fit_alpha_beta([(0, 0.5), (1000, 1.5), (2000, 2.5)])
    AlphaBeta(alpha_ms=0.5, bytes_per_ms=1000.0)
    """
    if len(samples) < 2:
        raise ValueError(f"fit_alpha_beta needs at least 2 (bytes, ms) samples, got {len(samples)}")
    ordered = sorted(samples)
    (small_bytes, alpha), rest = ordered[0], ordered[1:]
    if all(x == small_bytes for x, _ in rest):
        raise ValueError("fit_alpha_beta needs samples of at least two different sizes")
    rest = [(x - small_bytes, y - alpha) for x, y in rest]
    slope = sum(x * y for x, y in rest) / sum(x * x for x, _ in rest)
    slope = max(slope, 1e-12)
    return AlphaBeta(round(max(alpha - small_bytes * slope, 0.0), 6), round(1.0 / slope, 3))


def default_profile_path() -> Path:
    """Where `python -m rectoolkit.planner.calibrate` writes by default and `profile="default"` reads:
    $RECTOOLKIT_PROFILE, else ~/.cache/rectoolkit/calibration.json."""
    return Path(os.environ.get("RECTOOLKIT_PROFILE") or "~/.cache/rectoolkit/calibration.json").expanduser()


def load_profile(profile: Union[None, str, Path, CalibrationProfile]) -> Optional[CalibrationProfile]:
    """A profile from a path, "default" (default_profile_path()) or a profile object (None stays None)."""
    if profile is None or isinstance(profile, CalibrationProfile):
        return profile
    if str(profile) == "default":
        profile = default_profile_path()
    return CalibrationProfile.load(profile)
