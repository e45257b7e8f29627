"""Fit a CalibrationProfile's terms from the timings rectoolkit.planner.calibrate measures.

The calibration's workers only time things; this module turns those timings into the profile's terms. Each fit
reads one measurement: fit_collectives the collectives' (bytes, ms) samples (one alpha-beta pair per kind);
lookup_slopes and monotone_curve the single-table lookups (read speed curve, per-id and per-output-byte costs);
fixed_terms the tiny sharded plans' steps (per step, per shard, per sharding-type group); engine_slope and id_term
the 16 MiB table's steps at ENGINE_POOLINGS ids per bag (the engine's work per id), input_slope and routing_id_term
its input_dist alone, table-wise and row-wise (row-block routing per id); shard_terms the full-batch steps (per shard, replica and row-routed shard); parallelism_term the heavy
steps (how many local ranks run at once). fit_profile puts them together. The grid below (sizes, widths, batches)
is what the calibration measures at and what the fits assume.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from rectoolkit.planner.profile import (COLLECTIVE_KINDS, SHARDING_TYPES, AlphaBeta, CalibrationProfile, LookupTerms,
                                        fit_alpha_beta)

A2A_PEER_BYTES = (64, 4 << 10, 64 << 10, 512 << 10, 2 << 20)  # bytes to each peer
BUFFER_BYTES = (256, 16 << 10, 256 << 10, 2 << 20, 8 << 20)  # the whole buffer of all_reduce, reduce_scatter, all_gather
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
LOOKUP_DIMS = (16, 128)  # two row widths: their difference is the per-byte cost, the narrow one's rest per id
LOOKUP_SAMPLES, LOOKUP_IDS_PER_BAG = 1024, (1, 32)  # two batches of as many bags: their difference is per id
MIN_MS_PER_BYTE = 1e-9  # 1000 GB/s: a slope below this is noise
ZIPF_ALPHA = 0.0  # uniform ids: a shard's working set is all of it (skewed ids would make big tables look cached)


class CalibrationError(RuntimeError):
    """Calibration could not run; the message says why and what to do."""


def lookup_slopes(times: Dict[Tuple[int, int], float], read_ms_per_byte: Optional[float] = None) -> Tuple[float, float, float]:
    """(ms per id, ms per row byte, ms per output byte) from one pass timed at LOOKUP_DIMS x (small, large) batches
    of LOOKUP_SAMPLES bags: each difference of two batches leaves the call's fixed part out. With
    `read_ms_per_byte` (the backward), the per-row-byte slope is returned as a multiple of it (read_factor).

    >>> t = {(16, 1): 1.0 + 1024 * (1e-5 + 64e-6) + 1024 * 64 * 1e-7, (16, 32): 1.0 + 32768 * (1e-5 + 64e-6) + 1024 * 64 * 1e-7,
    ...      (128, 1): 1.0 + 1024 * (1e-5 + 512e-6) + 1024 * 512 * 1e-7, (128, 32): 1.0 + 32768 * (1e-5 + 512e-6) + 1024 * 512 * 1e-7}
    >>> [round(x, 9) for x in lookup_slopes(t)]
    [1e-05, 1e-06, 1e-07]
    """
    small, large = LOOKUP_IDS_PER_BAG
    extra_ids = (large - small) * LOOKUP_SAMPLES
    low, high = LOOKUP_DIMS
    per_id = {d: (times[(d, large)] - times[(d, small)]) / extra_ids for d in LOOKUP_DIMS}
    extra_row_bytes = 4.0 * (high - low)
    per_byte = max((per_id[high] - per_id[low]) / extra_row_bytes, 0.0)
    id_ms = max(per_id[low] - 4.0 * low * per_byte, 0.0)
    small_ids = small * LOOKUP_SAMPLES
    output_ms = (times[(high, small)] - times[(low, small)] - small_ids * extra_row_bytes * per_byte)
    output_ms_per_byte = max(output_ms / (LOOKUP_SAMPLES * extra_row_bytes), 0.0)
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


def _engine_lookups_ms(profile: CalibrationProfile, ids: float, samples: float) -> float:
    """What `profile`'s lookup terms (forward + SGD backward) price for `ids` into the 16 MiB table."""
    row_bytes = READ_DIM * 4
    per_byte = profile.read_ms_per_byte(float(READ_TABLE_BYTES[2]))
    return sum(terms.cost_ms(ids, row_bytes, per_byte, samples * row_bytes)
               for terms in (profile.forward, profile.backward("sgd")))


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


def shard_terms(step_ms: Dict[str, float], world_size: int, profile: CalibrationProfile) -> Tuple[float, float, float]:
    """(ms per table-wise shard, per data-parallel replica, per row-routed shard) under a full batch: four small
    tables against one, per table, less what the lookup terms and the engine's per-id work price for its ids (a
    table-wise shard receives every rank's bags, a replica its own rank's, a row-wise shard every rank's bags and its
    row block's share of their ids, plus the routing per id).

    >>> from rectoolkit.planner.profile import AlphaBeta, LookupTerms
    >>> p = CalibrationProfile({"all_to_all": AlphaBeta(0, 1), "all_reduce": AlphaBeta(0, 1)}, ((1.0, 1e12),), 1e6,
    ...                        forward=LookupTerms(0.0, 1.0, 0.0), backward_terms={"sgd": LookupTerms(0.0, 0.0, 0.0)})
    >>> shard_terms({"tw1_batch": 2.0, "tw4_batch": 5.0, "dp1_batch": 1.0, "dp4_batch": 7.0, "rw1_batch": 1.0,
    ...              "rw4_batch": 10.0}, 2, p)
    (1.0, 2.0, 3.0)
    """
    result = []
    for label, ids, bags, per_id in (("tw", world_size * READ_BATCH, world_size * READ_BATCH, profile.id_ms),
                                     ("dp", READ_BATCH, READ_BATCH, profile.id_ms),
                                     ("rw", READ_BATCH, world_size * READ_BATCH, profile.id_ms + profile.routing_id_ms)):
        per_table = (step_ms[f"{label}4_batch"] - step_ms[f"{label}1_batch"]) / 3.0
        lookups = _engine_lookups_ms(profile, ids, bags) + ids * per_id
        result.append(round(max(per_table - lookups, 0.0), 4))
    return result[0], result[1], result[2]


def parallelism_term(step_ms: Dict[str, float], world_size: int) -> float:
    """How many local ranks' lookups really run at once: the table-wise step with one 16 MiB table on rank 0 under a
    heavy batch (its work L = that step less the tiny one) against one such table on every rank. The model prices
    the latter as max(L, world_size x L / parallelism), so parallelism = world_size x L / (L + its extra time).

    >>> parallelism_term({"tw_heavy": 12.0, "tw": 2.0, "tw_each_heavy": 12.0}, 2)
    2.0
    >>> parallelism_term({"tw_heavy": 12.0, "tw": 2.0, "tw_each_heavy": 22.0}, 2)
    1.0
    """
    work = max(step_ms["tw_heavy"] - step_ms["tw"], 1e-9)
    extra = max(step_ms["tw_each_heavy"] - step_ms["tw_heavy"], 0.0)
    return min(float(world_size), max(1.0, world_size * work / (work + extra)))


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
    and fixed_median, load_probe), with a record of the machine and the run (`machine`)."""
    reads = payload["reads"]
    collectives = fit_collectives(payload["collectives"])
    step, shard, group = fixed_terms(payload["fixed"], world_size)
    curve = tuple((size, round(bw, 1)) for size, bw in reads["read_curve"])
    machine = dict(host=platform.node(), processor=platform.processor() or platform.machine(), cores=os.cpu_count(),
                   torch=torch.__version__, device=compute_device, backend=backend, world_size=world_size,
                   threads_per_rank=threads, repeats=repeats, seconds=round(seconds, 1),
                   load_average=list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
                   measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   load_probe=payload.get("load_probe"),
                   fixed_plan_step_ms={k: round(v, 4) for k, v in payload["fixed"].items()},
                   fixed_plan_step_ms_median={k: round(v, 4) for k, v in payload["fixed_median"].items()},
                   collective_samples={k: [[b, round(ms, 4)] for b, ms in v] for k, v in payload["collectives"].items()})
    terms = lambda values: LookupTerms(*(float(f"{x:.6g}") for x in values))  # noqa: E731
    profile = CalibrationProfile(
        collectives=collectives, read_curve=curve, write_bytes_per_ms=round(reads["write_bytes_per_ms"], 1),
        forward=terms(reads["forward"]), backward_terms={k: terms(v) for k, v in reads["backward"].items()},
        step_ms=step, group_ms=group, shard_ms=shard,
        memory_parallelism=round(parallelism_term(payload["fixed"], world_size), 3), machine=machine)
    profile = dataclasses.replace(profile, id_ms=round(id_term(payload["fixed"], world_size, profile), 8),
                                  id_row_bytes=float(READ_DIM * 4))
    profile = dataclasses.replace(profile,
                                  routing_id_ms=round(routing_id_term(payload["fixed"], world_size), 8))
    shard_ms, replica_ms, routed_shard_ms = shard_terms(payload["fixed"], world_size, profile)
    return dataclasses.replace(profile, shard_ms=shard_ms, replica_ms=replica_ms, routed_shard_ms=routed_shard_ms)
