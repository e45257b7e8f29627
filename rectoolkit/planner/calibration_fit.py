"""Fit a CalibrationProfile's terms from the timings rectoolkit.planner.calibrate measures.

The calibration's workers only time things; this module turns those timings into the profile's terms. Each fit
reads one measurement: fit_collectives the collectives' (bytes, ms) samples (one alpha-beta pair per kind);
lookup_slopes and monotone_curve the single-table lookups (read speed curve, per-id, per-distinct-row-byte and
per-output-byte costs); fixed_terms the tiny sharded plans' steps (per step, per shard, per sharding-type group),
group_terms_beside the groups other than table-wise from plan-sized steps on the wall clock;
engine_slope and id_term the 16 MiB table's steps at ENGINE_POOLINGS ids per bag (the engine's work per id),
input_slope and routing_id_term its input_dist alone, table-wise and row-wise (row-block routing per id); shard_terms
the full-batch steps (per shard, replica and row-routed shard); parallelism_term the heavy lookup on rank 0 alone and
on every rank at once (how many local ranks run at once). fit_profile puts them together. The grid below (sizes,
widths, batches) is what the calibration measures at and what the fits assume.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from rectoolkit.plan.types import ShardingType
from rectoolkit.planner.profile import (COLLECTIVE_KINDS, SHARDING_TYPES, AlphaBeta, CalibrationProfile, LookupTerms,
                                        expected_rows_read, fit_alpha_beta)

A2A_PEER_BYTES = (64, 4 << 10, 64 << 10, 512 << 10, 2 << 20)  # bytes to each peer
# the whole buffer of all_reduce, reduce_scatter, all_gather; the largest past a last-level cache (32 MiB here), as a
# data-parallel gradient is: an 8 MiB one in cache all-reduced about 1.6x faster per byte than 163 MiB of replicas
BUFFER_BYTES = (256, 16 << 10, 256 << 10, 2 << 20, 64 << 20)
READ_TABLE_BYTES = (256 << 10, 2 << 20, 16 << 20, 128 << 20)
READ_DIM = 64
READ_BATCH, READ_POOLING = 512, 20  # the engine's full batch: bags per rank, ids per bag
LIGHT_POOLING = 2  # the engine's light batch: the full one less this is the per-id slope
HEAVY_POOLING = 100  # the engine's heavy batch: enough work that local ranks' sharing stands out of the noise
# the engine's slope per id: a line through its step at these ids per bag, on collections built apart (one built
# collection's step can sit 10-20% off another's, more than the slope's whole rise over two points)
ENGINE_POOLINGS = (LIGHT_POOLING, 5, 10, READ_POOLING)
ENGINE_INSTANCES = 2
# the input_dist alone (routing_id_term): it costs about 1.5 ms at any batch, with 0.3-0.5 ms of noise between
# calls, so its rise is measured over many more ids than a step's
INPUT_POOLINGS = (LIGHT_POOLING, 20, 50, HEAVY_POOLING)
SMALL_TABLE_ROWS = 64  # the fixed costs' tiny tables (one id per bag: every row read many times)
# the small table's sharding types beside plan-sized table-wise work (group_terms_beside); table-wise first: the others'
# steps are read against its
BESIDE_KINDS = ("table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel")
BESIDE_ROUNDS_PER_REPEAT = 4  # their fastest of 4 x the repeats: the wall clock's fastest moves more than CPU time's
LOOKUP_DIMS = (16, 128)  # two row widths: their difference is the per-byte cost, the narrow one's rest per id
LOOKUP_SAMPLES, LOOKUP_IDS_PER_BAG = 1024, (1, 32)  # two batches of as many bags: their difference is per id
MIN_MS_PER_BYTE = 1e-9  # 1000 GB/s: a slope below this is noise
ZIPF_ALPHA = 0.0  # uniform ids: a shard's working set is all of it (skewed ids would make big tables look cached)


class CalibrationError(RuntimeError):
    """Calibration could not run; the message says why and what to do."""


def lookup_slopes(times: Dict[Tuple[int, int], float], read_ms_per_byte: Optional[float] = None,
                  table_bytes: Optional[float] = None) -> Tuple[float, float, float]:
    """(ms per id, ms per row byte read, ms per output byte) from one pass timed at LOOKUP_DIMS x (small, large)
    batches of LOOKUP_SAMPLES bags: t = fixed + ids x per id + rows read x row bytes x per byte + output bytes x per
    output byte, solved exactly over the four timings (the call's fixed part is left out). Rows read: the distinct
    rows of `table_bytes` that the batch's uniform ids touch (expected_rows_read; without `table_bytes` one per id).
    With `read_ms_per_byte` (the backward), the per-row-byte slope is returned as a multiple of it (read_factor).

    >>> t = {(16, 1): 1.0 + 1024 * (1e-5 + 64e-6) + 1024 * 64 * 1e-7, (16, 32): 1.0 + 32768 * (1e-5 + 64e-6) + 1024 * 64 * 1e-7,
    ...      (128, 1): 1.0 + 1024 * (1e-5 + 512e-6) + 1024 * 512 * 1e-7, (128, 32): 1.0 + 32768 * (1e-5 + 512e-6) + 1024 * 512 * 1e-7}
    >>> [round(x, 9) for x in lookup_slopes(t)]
    [1e-05, 1e-06, 1e-07]
    """
    keys = [(dim, per_bag) for dim in LOOKUP_DIMS for per_bag in LOOKUP_IDS_PER_BAG]
    ids = np.array([per_bag * LOOKUP_SAMPLES for _, per_bag in keys], dtype=float)
    row_bytes = np.array([4.0 * dim for dim, _ in keys])
    rows_read = ids if table_bytes is None else np.array(
        [float(expected_rows_read(n, table_bytes // row)) for n, row in zip(ids, row_bytes)])
    columns = np.stack([np.ones(len(keys)), ids, rows_read * row_bytes, LOOKUP_SAMPLES * row_bytes], axis=1)
    y = np.array([times[key] for key in keys])
    solution = np.linalg.lstsq(columns, y, rcond=None)[0]
    if solution[2] < 0:  # reads faster than free: noise; refit without them
        solution = np.insert(np.linalg.lstsq(np.delete(columns, 2, axis=1), y, rcond=None)[0], 2, 0.0)
    _, id_ms, per_byte, output_ms_per_byte = (max(float(x), 0.0) for x in solution)
    if read_ms_per_byte is not None:
        return id_ms, per_byte / read_ms_per_byte, output_ms_per_byte
    return id_ms, per_byte, output_ms_per_byte


def monotone_curve(curve: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    """The read curve with no table reading slower than a larger one (a small table's slope is the noisiest: its
    reads cost least), from the largest size down.

    >>> monotone_curve([(1.0, 50.0), (2.0, 80.0), (3.0, 20.0)])
    [(1.0, 80.0), (2.0, 80.0), (3.0, 20.0)]
    """
    points, fastest = [], 0.0
    for size, bytes_per_ms in sorted(curve, reverse=True):
        fastest = max(fastest, bytes_per_ms)
        points.append((size, fastest))
    return sorted(points)


def fixed_terms(step_ms: Dict[str, float], world_size: int) -> Tuple[float, float, Dict[str, float]]:
    """(ms per step, ms per shard, ms per sharding-type group) from the tiny plans' step times.

    tw = step + g_tw + s; tw4 = step + g_tw + 4 s; X = step + g_X + s; tw+X = step + g_tw + g_X + (1 + s_X) s on
    rank 0 (s_X: X's shards on rank 0, one for every type here) -> s, g_tw from tw+row_wise, then each g_X.

    >>> fixed_terms({"tw": 3.0, "tw4": 6.0, "row_wise": 4.0, "tw+row_wise": 6.0}, 2)
    (1.0, 1.0, {'table_wise': 1.0, 'row_wise': 2.0})
    """
    shard = max((step_ms["tw4"] - step_ms["tw"]) / 3.0, 0.0)
    group = {"table_wise": max(step_ms["tw+row_wise"] - step_ms["row_wise"] - shard, 0.0)}
    step = max(step_ms["tw"] - group["table_wise"] - shard, 0.0)
    for kind in SHARDING_TYPES:
        if kind == "table_wise" or "tw+" + kind not in step_ms:
            continue
        group[kind] = max(step_ms["tw+" + kind] - step_ms["tw"] - shard, 0.0)
    if "table_row_wise" in group:
        group.setdefault("grid_shard", group["table_row_wise"])  # a grid group runs table-row-wise's code
    return round(step, 4), round(shard, 4), {k: round(v, 4) for k, v in group.items()}


def group_terms_beside(wall_ms: Mapping[str, float], world_size: int,
                       collectives: Mapping[str, AlphaBeta]) -> Dict[str, float]:
    """ms per sharding-type group beside plan-sized work: the fastest wall step with the small table in a group of
    its own ("beside_<kind>") less the same with it table-wise in the table-wise group ("beside_table_wise"), less
    the latency its group's collective calls are priced (cost.collective_calls x alpha). What remains is what the
    tiny steps of fixed_terms miss: the group synchronizes the ranks inside real work (on the 2-core CPU machine a
    data-parallel group of one replicated table cost 1-2 ms a step where its all-reduce's alpha is 0.15 ms and
    fixed_terms fit 0). Table-wise's own group term stays fixed_terms'; grid runs table-row-wise's code.

    >>> ab = {kind: AlphaBeta(0.1, 1e6) for kind in COLLECTIVE_KINDS}
    >>> group_terms_beside({"beside_table_wise": 5.0, "beside_row_wise": 7.0, "beside_column_wise": 5.2,
    ...                     "beside_table_row_wise": 8.0, "beside_data_parallel": 6.0}, 2, ab)
    {'row_wise': 1.6, 'column_wise': 0.0, 'table_row_wise': 2.4, 'data_parallel': 0.9, 'grid_shard': 2.4}
    """
    from rectoolkit.planner.step_time import collective_calls

    missing = sorted(f"beside_{kind}" for kind in BESIDE_KINDS if f"beside_{kind}" not in wall_ms)
    if missing:
        raise CalibrationError(f"calibration: no plan-sized steps {missing}; measure_groups_beside times all of "
                               f"{['beside_' + kind for kind in BESIDE_KINDS]}")
    base = wall_ms["beside_table_wise"]
    group = {}
    for kind in BESIDE_KINDS[1:]:
        calls = collective_calls(ShardingType.parse(kind), 1, world_size)
        latency = sum(count * collectives[name].alpha_ms for name, count in calls.items())
        group[kind] = round(max(wall_ms[f"beside_{kind}"] - base - latency, 0.0), 4)
    group["grid_shard"] = group["table_row_wise"]
    return group


def _engine_lookups_ms(profile: CalibrationProfile, ids: float, samples: float,
                       rows: int = READ_TABLE_BYTES[2] // (READ_DIM * 4)) -> float:
    """What `profile`'s lookup terms (forward + SGD backward) price for `ids` into a shard of `rows` rows READ_DIM
    wide (the 16 MiB table unless said)."""
    row_bytes = READ_DIM * 4
    per_byte = profile.read_ms_per_byte(float(rows * row_bytes))
    rows_read = profile.rows_read(ids, rows)
    return float(sum(terms.cost_ms(ids, row_bytes, per_byte, samples * row_bytes, rows_read)
                     for terms in (profile.forward, profile.backward("sgd"))))


def _points(step_ms: Mapping[str, float], prefix: str, ids_per_bag: Callable[[int], float]) -> List[Tuple[float, float]]:
    """(ids, ms) of the timings keyed "<prefix><ids per bag>_<instance>"; at least two batch sizes."""
    points = [(ids_per_bag(int(key[len(prefix):].split("_")[0])), ms) for key, ms in step_ms.items()
              if key.startswith(prefix)]
    if len({ids for ids, _ in points}) < 2:
        raise ValueError(f"calibration: the {prefix!r} timings need two batch sizes at least, got "
                         f"{sorted(k for k in step_ms if k.startswith(prefix))}")
    return points


def engine_slope(step_ms: Mapping[str, float], name: str, ids_per_bag: Callable[[int], float],
                 profile: CalibrationProfile) -> float:
    """ms per id of the engine's `name` steps ("tw") beyond what the profile's lookup terms price: the least-squares
    slope of (step - lookups) over the ids a rank looks up, through every ENGINE_POOLINGS x ENGINE_INSTANCES step
    measured (keys "<name>_p<ids per bag>_<instance>"). `ids_per_bag(p)`: the ids the slowest rank looks up at p
    ids per bag.

    >>> from rectoolkit.planner.profile import AlphaBeta
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e9),), 1e6)
    >>> steps = {"tw_p2_0": 3.0, "tw_p20_0": 5.1, "tw_p2_1": 3.2, "tw_p20_1": 4.9}  # 1.9 ms more for 1800 more ids
    >>> round(engine_slope(steps, "tw", lambda pooling: 100.0 * pooling, p), 7)  # less the lookups' 7.7e-7 per id
    0.0010548
    """
    points = _points(step_ms, f"{name}_p", ids_per_bag)
    ids = np.array([i for i, _ in points])
    rest = np.array([ms - _engine_lookups_ms(profile, i, 0.0) for i, ms in points])
    return float(np.polyfit(ids, rest, 1)[0])


def input_slope(step_ms: Mapping[str, float], name: str, ids_per_bag: Callable[[int], float]) -> float:
    """ms per id of the `name` collection's input_dist alone ("tw" or "rw"): the least-squares slope of its timings
    (keys "<name>_in_p<ids per bag>_<instance>") over the ids the slowest rank receives at p ids per bag.

    >>> round(input_slope({"rw_in_p2_0": 1.0, "rw_in_p20_0": 2.8}, "rw", lambda pooling: 100.0 * pooling), 6)
    0.001
    """
    ids, ms = np.array(_points(step_ms, f"{name}_in_p", ids_per_bag)).T
    return float(np.polyfit(ids, ms, 1)[0])


def id_term(step_ms: Mapping[str, float], world_size: int, profile: CalibrationProfile) -> float:
    """ms per id a shard receives (forward + backward) that the lookup terms leave out: the slope of the table-wise
    16 MiB table's step over its ids per bag (engine_slope; rank 0 receives every rank's bags) is the engine's own
    work per id (checks, offsets, gradient rows), for rows READ_DIM floats wide: the cost model prices it in
    proportion to a shard's row bytes (CalibrationProfile.id_cost_ms).

    >>> from rectoolkit.planner.profile import AlphaBeta, LookupTerms
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e9),), 1e6,
    ...                        forward=LookupTerms(0.0, 1.0, 0.0), backward_terms={"sgd": LookupTerms(0.0, 1.0, 0.0)})
    >>> round(id_term({"tw_p20_0": 20.0, "tw_p2_0": 2.0}, 2, p), 7)
    0.0009761
    """
    return max(engine_slope(step_ms, "tw", lambda pooling: world_size * READ_BATCH * pooling, profile), 0.0)


def routing_id_term(step_ms: Mapping[str, float], world_size: int) -> float:
    """ms per id a shard receives that row-block routing (row-wise, table-row-wise, grid) adds: the 16 MiB table's
    input_dist alone, row-wise (each rank buckets its ids by row block and receives 1/world_size of all of them)
    against table-wise (rank 0 receives them all), each a slope per id received (input_slope). The input_dist is
    where the routing runs and the one phase that rises row-wise (the bench's phases: the lookup and the backward
    rise little); it is short, so its slope repeats better than a whole step's (68-90 ns per id in four runs where
    the steps' difference gave 72-235).

    >>> round(routing_id_term({"rw_in_p2_0": 1.0, "rw_in_p20_0": 1.9, "tw_in_p2_0": 1.0, "tw_in_p20_0": 1.18}, 2), 8)
    8.789e-05
    >>> routing_id_term({"rw_in_p2_0": 1.0, "rw_in_p20_0": 1.0, "tw_in_p2_0": 1.0, "tw_in_p20_0": 2.0}, 2)
    0.0
    """
    routed = input_slope(step_ms, "rw", lambda pooling: READ_BATCH * pooling)
    whole = input_slope(step_ms, "tw", lambda pooling: world_size * READ_BATCH * pooling)
    return max(routed - whole, 0.0)


def shard_terms(step_ms: Dict[str, float], world_size: int, profile: CalibrationProfile,
                replica_step_ms: Optional[Dict[str, float]] = None) -> Tuple[float, float, float]:
    """(ms per table-wise shard, per data-parallel replica, per row-routed shard) under a full batch: four small
    tables (SMALL_TABLE_ROWS rows each) against one, per table, less what the lookup terms and the engine's per-id
    work price for its ids (a table-wise shard receives every rank's bags, a replica its own rank's, a row-wise shard
    every rank's bags and its row block's share of their ids, plus the routing per id).

    `replica_step_ms`: the step times the replica's term is read from instead (fit_profile gives the median steps:
    a replica's 0.5-0.9 ms a table is the smallest of the three differences, and the difference of two fastest
    repeats moved it 0.32-0.76 ms between nine calibrations, the medians' 0.56-0.83; at the low end the planner
    replicated 10-11 of dlrm26's small tables, a plan that measured 1.03-1.12x its table-wise plans head to head).

    >>> from rectoolkit.planner.profile import AlphaBeta, LookupTerms
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e12),), 1e6,
    ...                        forward=LookupTerms(0.0, 1.0, 0.0), backward_terms={"sgd": LookupTerms(0.0, 0.0, 0.0)})
    >>> shard_terms({"tw1_batch": 2.0, "tw4_batch": 5.0, "dp1_batch": 1.0, "dp4_batch": 7.0, "rw1_batch": 1.0,
    ...              "rw4_batch": 10.0}, 2, p)
    (1.0, 2.0, 3.0)
    """
    result = []
    tw_rows, rw_rows = SMALL_TABLE_ROWS, SMALL_TABLE_ROWS // world_size
    for label, ids, bags, rows, per_id in (
            ("tw", world_size * READ_BATCH, world_size * READ_BATCH, tw_rows, profile.id_ms),
            ("dp", READ_BATCH, READ_BATCH, tw_rows, profile.id_ms),
            ("rw", READ_BATCH, world_size * READ_BATCH, rw_rows, profile.id_ms + profile.routing_id_ms)):
        steps = replica_step_ms if label == "dp" and replica_step_ms is not None else step_ms
        per_table = (steps[f"{label}4_batch"] - steps[f"{label}1_batch"]) / 3.0
        lookups = _engine_lookups_ms(profile, ids, bags, rows) + ids * per_id
        result.append(round(max(per_table - lookups, 0.0), 4))
    return result[0], result[1], result[2]


def parallelism_term(alone_ms: Sequence[float], together_ms: Sequence[float], world_size: int) -> float:
    """How many local ranks' lookups really run at once: the heavy 16 MiB lookup (forward, backward and update) on
    rank 0 while the others wait, against the same on every rank at once, round by round. The model prices the
    latter as world_size x alone / parallelism, so parallelism = world_size / (together / alone), the ratio the
    median of the rounds' (each round times both back to back: a burst of load slows the pair alike), in [1,
    world_size]. Kernels alone: a sharded step would add the second table's communication to the ranks' sharing.

    >>> parallelism_term([10.0, 10.0, 12.0], [10.0, 11.0, 20.0], 2)
    1.8181818181818181
    >>> parallelism_term([10.0], [25.0], 2), parallelism_term([10.0], [9.0], 2)
    (1.0, 2.0)
    """
    if not alone_ms or len(alone_ms) != len(together_ms):
        raise ValueError(f"parallelism_term: one time alone and one together per round, got {len(alone_ms)} and "
                         f"{len(together_ms)}")
    ratio = float(np.median(np.asarray(together_ms, dtype=float) / np.maximum(np.asarray(alone_ms, dtype=float), 1e-9)))
    return min(float(world_size), max(1.0, world_size / max(ratio, 1e-9)))


def fit_collectives(samples: Mapping[str, Sequence[Tuple[float, float]]]) -> Dict[str, AlphaBeta]:
    """One alpha-beta pair per collective kind, each fitted alike from its own (bytes, ms) samples (fit_alpha_beta).

    >>> fit_collectives({kind: [(0, 0.5), (1000, 1.5), (2000, 2.5)] for kind in COLLECTIVE_KINDS})["all_gather"]
    AlphaBeta(alpha_ms=0.5, bytes_per_ms=1000.0)
    """
    missing = [kind for kind in COLLECTIVE_KINDS if not samples.get(kind)]
    if missing:
        raise CalibrationError(f"calibration: no timings of {missing}; every kind of {COLLECTIVE_KINDS} is measured")
    return {kind: fit_alpha_beta(samples[kind]) for kind in COLLECTIVE_KINDS}


def fit_profile(payload: dict, world_size: int, backend: str, compute_device: str, threads: int, repeats: int,
                seconds: float) -> CalibrationProfile:
    """The CalibrationProfile fitted from one calibration's timings (`payload`: rank 0's collectives, reads, fixed
    and fixed_median, beside (the plan-sized steps, wall, every round), sharing (the heavy lookup's times alone and together, per
    round), load_probe), with a record of the machine and the run (`machine`)."""
    reads = payload["reads"]
    collectives = fit_collectives(payload["collectives"])
    step, shard, group = fixed_terms(payload["fixed"], world_size)
    beside = {name: min(rounds) for name, rounds in payload["beside"].items()}  # (the fastest round of each)
    group.update(group_terms_beside(beside, world_size, collectives))
    curve = tuple((size, round(bw, 1)) for size, bw in reads["read_curve"])
    machine = dict(host=platform.node(), processor=platform.processor() or platform.machine(), cores=os.cpu_count(),
                   torch=torch.__version__, device=compute_device, backend=backend, world_size=world_size,
                   threads_per_rank=threads, repeats=repeats, seconds=round(seconds, 1),
                   load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                   measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   load_probe=payload.get("load_probe"), cpus=payload.get("cpus"),
                   fixed_plan_step_ms={k: round(v, 4) for k, v in payload["fixed"].items()},
                   fixed_plan_step_ms_median={k: round(v, 4) for k, v in payload["fixed_median"].items()},
                   beside_step_ms={k: round(v, 4) for k, v in beside.items()},
                   beside_round_ms={k: [round(ms, 4) for ms in v] for k, v in payload["beside"].items()},
                   sharing_ms={k: [round(ms, 4) for ms in v] for k, v in zip(("alone", "together"), payload["sharing"])},
                   collective_samples={k: [[b, round(ms, 4)] for b, ms in v] for k, v in payload["collectives"].items()})
    terms = lambda values: LookupTerms(*(float(f"{x:.6g}") for x in values))  # noqa: E731
    profile = CalibrationProfile(
        collectives=collectives, read_curve=curve, write_bytes_per_ms=round(reads["write_bytes_per_ms"], 1),
        forward=terms(reads["forward"]), backward_terms={k: terms(v) for k, v in reads["backward"].items()},
        step_ms=step, group_ms=group, shard_ms=shard,
        memory_parallelism=round(parallelism_term(*payload["sharing"], world_size), 3), machine=machine)
    profile = dataclasses.replace(profile, id_ms=round(id_term(payload["fixed"], world_size, profile), 8),
                                  id_row_bytes=float(READ_DIM * 4))
    profile = dataclasses.replace(profile,
                                  routing_id_ms=round(routing_id_term(payload["fixed"], world_size), 8))
    shard_ms, replica_ms, routed_shard_ms = shard_terms(payload["fixed"], world_size, profile,
                                                        replica_step_ms=payload["fixed_median"])
    return dataclasses.replace(profile, shard_ms=shard_ms, replica_ms=replica_ms, routed_shard_ms=routed_shard_ms)
