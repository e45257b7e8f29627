"""The search: pick an option and a placement for every table, minimizing the slowest rank's time.

Costs are additive per rank, so the search keeps one [3, W] array (time, HBM, DDR per rank; see
rectoolkit.planner.state) and prices a candidate placement of an option in O(world_size) with the closed
forms of rectoolkit.planner.cost:

1. greedy, biggest tables first: for each table, every option at its best placement, scored by
   max(slowest rank after, lower bound (all work so far + the least work the remaining tables need) / W);
   slower kernels (UVM) are tried only when faster ones do not fit; options whose bound cannot win are skipped;
2. local search on the slowest rank: the best swap of two single-shard tables (all candidate swaps priced in
   one array operation), else the best move of one of its tables to another option/placement, while that
   lowers (slowest time, number of ranks at it);
3. on small instances, restarts with another table order or without the bound; the best plan wins;
4. `rectoolkit.planner.exhaustive.exhaustive_search` (small instances) finds the optimum, to check 1-3.

Objectives: "time" (default), "memory" (balance: lowest peak fraction of memory used), "bytes" (fewest bytes
moved per step; placement then by time). Deterministic: no randomness, ties go to the lower index.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from rectoolkit.planner.enumerate import ShardingOption
from rectoolkit.planner.state import (DDR, HBM, REL_TOL, TIME, Assignment, SearchState, TableLoads, assignment_bytes,
                                      fixed_vectors, host_candidates, less, max_other_hosts, measure,
                                      rank_candidates)
from rectoolkit.planner.topology import Topology

OBJECTIVES = ("time", "memory", "bytes")
# Restarts (tables x ranks): greedy without the bound only pays off on tiny instances (measured on the
# search-quality instances and 26-200 tables on 2-64 ranks), biggest-memory-first up to small ones.
TINY_INSTANCE = 256
SMALL_INSTANCE = 4096
SWAP_CANDIDATES = 16  # tables on the slowest rank considered for a swap (the 8 largest single-shard ones swap)


class Searcher:
    """Greedy + local search over the options of every table (see the module docstring)."""

    def __init__(self, topology: Topology, options: Sequence[Sequence[ShardingOption]], objective: str = "time",
                 hbm_base: float = 0.0, ddr_base: float = 0.0,
                 allowed_ranks: Optional[Sequence[Optional[Sequence[int]]]] = None, fill=None,
                 deadline: Optional[float] = None) -> None:
        """fill(list of options) attaches costs (CostModel.fill_many); needed when options come without them.
        deadline (time.monotonic()): past it, no more local-search rounds or restarts (`timed_out` says so); the
        greedy placement always completes, so a plan always comes back."""
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; use one of {OBJECTIVES}")
        self.topology = topology
        self.options = [_speed_sorted(opts) for opts in options]
        self.objective = objective
        self.hbm_base, self.ddr_base = hbm_base, ddr_base
        self.W, self.L, self.H = topology.world_size, topology.local_world_size, topology.num_hosts
        self.allowed_ranks = list(allowed_ranks) if allowed_ranks is not None else [None] * len(options)
        self.fill = fill
        self.deadline = deadline
        self.timed_out = False
        self._by_total_time_cache: Dict[int, List[ShardingOption]] = {}  # table -> options, cheapest total first
        self._masks = []
        for allowed in self.allowed_ranks:
            if allowed is None:
                self._masks.append((None, None))
                continue
            rank_mask = np.zeros(self.W, dtype=bool)
            rank_mask[[r for r in allowed if 0 <= r < self.W]] = True
            self._masks.append((rank_mask, rank_mask.reshape(self.H, self.L).all(axis=1)))
        eager = []  # the fastest kernel of each shape now (in one batch), slower ones when first needed
        for opts in self.options:
            seen = set()
            for option in opts:
                shape = option.shape
                if shape not in seen and option.time_ms is None:
                    seen.add(shape)
                    eager.append(option)
        if eager:
            if fill is None:
                raise ValueError("options without costs need a fill function")
            fill(eager)
        self.min_total_time = [min(o.total_time_ms for o in opts if o.time_ms is not None) for opts in self.options]

    def _by_total_time(self, table: int) -> List[ShardingOption]:
        """The table's options, cheapest total time first (unfilled slower kernels after their shape)."""
        cache = self._by_total_time_cache
        if table not in cache:
            first_total = {}
            for option in self.options[table]:
                shape = option.shape
                if option.time_ms is not None:
                    first_total.setdefault(shape, option.total_time_ms)
            cache[table] = sorted(self.options[table], key=lambda o: (
                first_total.get(o.shape, np.inf), o.speed_rank))
        return cache[table]

    def ensure_costs(self, option: ShardingOption) -> None:
        if option.time_ms is None:
            if self.fill is None:
                raise ValueError(f"option {option.label} has no costs; give the Searcher a fill function")
            self.fill([option])

    def new_state(self) -> SearchState:
        return SearchState(self.topology, self.hbm_base, self.ddr_base)

    # ---- placing one option -----------------------------------------------------------------------------
    def place_option(self, state: SearchState, option: ShardingOption,
                     table: int) -> Optional[Tuple[Tuple[int, ...], SearchState]]:
        """Best locations for the option's groups (one after another) and the state after; None if it cannot fit."""
        self.ensure_costs(option)
        rank_mask, host_mask = self._masks[table]
        L, H = self.L, self.H
        if option.kind == "fixed":
            if rank_mask is not None and not rank_mask.all():
                return None
            if np.any(state.hbm + option.hbm_bytes > state.hbm_limit) or np.any(state.ddr + option.ddr_bytes > state.ddr_limit):
                return None
            trial = state.copy()
            trial.add(fixed_vectors(option))
            trial.total_bytes += option.total_bytes
            return (), trial
        memory_objective = self.objective == "memory"
        trial = state  # copied before the first change
        locations: List[int] = []
        for _ in range(option.num_groups):
            if option.kind == "rank":
                owner, mate, outside = option.time_ms
                ok = (trial.hbm_limit - trial.hbm >= option.hbm_bytes) & (trial.ddr_limit - trial.ddr >= option.ddr_bytes)
                if rank_mask is not None:
                    ok &= rank_mask
                if option.one_host and locations:  # TABLE_COLUMN_WISE: the first block chose the host
                    ok &= np.arange(self.W) // L == locations[0] // L
                slowest = rank_candidates(trial.time, owner, mate, outside, L, trial.host_stats())
                if memory_objective:
                    used, cap = trial.primary_memory()
                    added = (option.hbm_bytes if state.uses_hbm else option.ddr_bytes) / cap
                    keys = (rank_candidates(used / cap, added, 0.0, 0.0, L), slowest, trial.time)
                else:
                    keys = (slowest, trial.time)
            else:
                inside, outside = option.time_ms
                ok = (((trial.hbm_limit - trial.hbm).reshape(H, L) >= option.hbm_bytes[None, :])
                      & ((trial.ddr_limit - trial.ddr).reshape(H, L) >= option.ddr_bytes[None, :])).all(axis=1)
                if host_mask is not None:
                    ok &= host_mask
                slowest = host_candidates(trial.time, inside, outside, L)
                if memory_objective:
                    used, cap = trial.primary_memory()
                    added = option.hbm_bytes if state.uses_hbm else option.ddr_bytes
                    primary = ((used.reshape(H, L) + added[None, :]) / cap.reshape(H, L)).max(axis=1)
                    primary = np.maximum(primary, max_other_hosts((used / cap).reshape(H, L).max(axis=1)))
                    keys = (primary, slowest)
                else:
                    keys = (slowest,)
            location = _argmin_lex(keys, ok)
            if location < 0:
                return None
            if trial is state:
                trial = state.copy()
            trial.add(trial.vectors(option, location))
            locations.append(location)
        if option.host_count_bytes:
            trial.add(trial.count_vectors(option, locations))
        trial.total_bytes += assignment_bytes(option, locations)
        return tuple(locations), trial

    def score(self, state: SearchState, remaining_time: float = 0.0) -> Tuple[float, ...]:
        slowest = float(state.time.max())
        if self.objective == "memory":
            return float(state.memory_fraction().max()), slowest
        if self.objective == "bytes":
            return state.total_bytes, slowest
        if not getattr(self, "_use_bound", True):
            return slowest, slowest
        bound = (float(state.time.sum()) + remaining_time) / self.W
        return max(slowest, bound), slowest

    def best_insertion(self, state: SearchState, table: int,
                       remaining_time: float = 0.0) -> Optional[Tuple[tuple, Assignment, SearchState]]:
        """The best (score, assignment, state after) over the table's options; None when nothing fits."""
        best = None
        fitted_shapes = set()
        prune = self.objective == "time" and getattr(self, "_use_bound", True)
        current_max = float(state.time.max()) if prune else 0.0
        current_sum = float(state.time.sum()) if prune else 0.0
        for option in self._by_total_time(table):
            shape = option.shape
            if shape in fitted_shapes:
                continue  # a faster kernel of this shape already fits
            if prune and best is not None:
                # its score is at least max(slowest now + what it adds to every rank, bound with its own total):
                # skip hopeless shapes (slower kernels of a shape add at least as much time)
                self.ensure_costs(option)
                floor = max(current_max + option.least_time_ms,
                            (current_sum + option.total_time_ms + remaining_time) / self.W)
                if floor > best[0][0] * (1 + 1e-9):
                    fitted_shapes.add(shape)
                    continue
            placed = self.place_option(state, option, table)
            if placed is None:
                continue
            fitted_shapes.add(shape)
            locations, after = placed
            key = self.score(after, remaining_time) + (option.total_time_ms,)
            if best is None or less(key, best[0]):
                best = (key, Assignment(option, locations), after)
        return best

    # ---- greedy, then local search -------------------------------------------------------------------------
    def greedy(self, order: Optional[Sequence[int]] = None) -> Tuple[Dict[int, Assignment], List[int], SearchState]:
        """Place tables biggest first. Returns (assignments, tables that did not fit, state)."""
        state = self.new_state()
        if order is None:
            order = self.default_order()
        remaining = float(sum(self.min_total_time))
        assignments: Dict[int, Assignment] = {}
        unplaced: List[int] = []
        for table in order:
            remaining -= self.min_total_time[table]
            best = self.best_insertion(state, table, remaining if self.objective == "time" else 0.0)
            if best is None:
                unplaced.append(table)
                continue
            _, assignments[table], state = best
        return assignments, unplaced, state

    def default_order(self) -> List[int]:
        def size(table: int) -> float:
            if self.objective == "memory":
                return min(float(np.sum(o.hbm_bytes) + np.sum(o.ddr_bytes)) for o in self.options[table]
                           if o.time_ms is not None)
            return self.min_total_time[table]
        return sorted(range(len(self.options)), key=lambda t: (-size(t), t))

    def local_search(self, assignments: Dict[int, Assignment], state: SearchState,
                     max_rounds: Optional[int] = None, candidates_per_round: int = 12) -> SearchState:
        """Swap or move tables away from the slowest rank while (slowest, ranks at it) decreases.

        Swaps first: they are priced all at once and, after the greedy pass, they make almost every
        improvement (moves won 4 of 85 rounds on 100 tables / 8-16 ranks); moves when no swap helps."""
        if self.objective != "time" or not assignments:
            return state
        if max_rounds is None:
            max_rounds = min(50 + 2 * len(assignments), 400)
        loads = TableLoads(state, assignments, len(self.options))
        for _ in range(max_rounds):
            if self.past_deadline():
                break
            current = measure(state.time)
            slowest = int(np.argmax(state.time))
            on_rank = loads.tables_on(slowest, max(candidates_per_round, SWAP_CANDIDATES))
            swapped = self._try_swaps(assignments, state, slowest, on_rank, current, loads)
            if swapped is not None:
                state = swapped
                continue
            for table in on_rank[:candidates_per_round]:
                without = state.copy()
                without.apply(assignments[table], -1.0)
                best = self._best_move(without, table, current)
                if best is not None:
                    assignments[table], state = best
                    loads.set(table, assignments[table])
                    break
            else:
                break
        return state

    def _best_move(self, state: SearchState, table: int,
                   current: Tuple[float, int]) -> Optional[Tuple[Assignment, SearchState]]:
        """The table's best option and placement in `state` (the plan without it), if it beats `current`."""
        best = None
        fitted_shapes = set()
        base_max, base_sum = float(state.time.max()), float(state.time.sum())
        for option in self.options[table]:
            shape = option.shape
            if shape in fitted_shapes:
                continue
            self.ensure_costs(option)
            # the slowest rank after placing it is at least the mean and at least the slowest now plus what the
            # option adds to every rank: skip options that cannot beat `current` (slower kernels of the shape
            # add at least as much time, so the shape is done)
            if max(base_max + option.least_time_ms, (base_sum + option.total_time_ms) / self.W) > current[0] * (1 + REL_TOL):
                fitted_shapes.add(shape)
                continue
            placed = self.place_option(state, option, table)
            if placed is None:
                continue
            fitted_shapes.add(shape)
            key = measure(placed[1].time)
            if less(key, current) and (best is None or less(key, best[0])):
                best = (key, Assignment(option, placed[0]), placed[1])
        return None if best is None else (best[1], best[2])

    def _try_swaps(self, assignments: Dict[int, Assignment], state: SearchState, slowest: int, on_rank: List[int],
                   current: Tuple[float, int], loads: TableLoads) -> Optional[SearchState]:
        """The best swap of a single-shard table on the slowest rank with one on a less loaded rank, if it
        lowers `current`. Every candidate swap is priced at once: state + (a: slowest -> r) + (b: r -> slowest)."""
        def single(t: int) -> bool:
            return assignments[t].option.kind == "rank" and assignments[t].option.num_groups == 1

        movable = [t for t in on_rank[:SWAP_CANDIDATES] if single(t) and assignments[t].locations[0] == slowest][:8]
        if not movable:
            return None
        targets = [int(r) for r in np.argsort(state.time, kind="stable")[:4] if r != slowest]
        leaving, coming, pairs = [], [], []  # (table, rank): a leaves the slowest rank for r, b comes from r
        for rank in targets:
            partners = [t for t in loads.tables_on(rank, 8, owners_only=True)
                        if single(t) and self._rank_allowed(t, slowest)]
            first_partner = len(coming)
            coming += [(partner, rank) for partner in partners]
            for table in movable:
                if self._rank_allowed(table, rank):
                    pairs += [(len(leaving), first_partner + i) for i, partner in enumerate(partners) if partner != table]
                    leaving.append((table, rank))
        if not pairs:
            return None

        def change(moves, to_slowest: bool) -> np.ndarray:  # [moves, 3, W]: vectors at the new place - at the old
            options = [assignments[t].option for t, _ in moves]
            ranks, here = [r for _, r in moves], [slowest] * len(moves)
            new, old = (here, ranks) if to_slowest else (ranks, here)
            return state.rank_vectors(options, new) - state.rank_vectors(options, old)

        out_at, in_at = np.array(pairs).T
        trials = state.load[None] + change(leaving, False)[out_at] + change(coming, True)[in_at]  # [swaps, 3, W]
        times = trials[:, TIME]
        slowest_after = times.max(axis=1)
        at_max = np.count_nonzero(times >= slowest_after[:, None] * (1 - REL_TOL), axis=1)
        fits = (trials[:, HBM] <= state.hbm_limit).all(axis=1) & (trials[:, DDR] <= state.ddr_limit).all(axis=1)
        tol = REL_TOL * max(abs(current[0]), 1e-30)
        better = (slowest_after < current[0] - tol) | ((slowest_after <= current[0] + tol) & (at_max < current[1]))
        ok = fits & better
        if not ok.any():
            return None
        pick = _argmin_lex((slowest_after, at_max.astype(float)), ok)
        (table, rank), (partner, _) = leaving[out_at[pick]], coming[in_at[pick]]
        assignments[table] = Assignment(assignments[table].option, (rank,))
        assignments[partner] = Assignment(assignments[partner].option, (slowest,))
        loads.set(table, assignments[table])
        loads.set(partner, assignments[partner])
        swapped = state.copy()
        swapped.bind(trials[pick].copy())
        return swapped

    def _rank_allowed(self, table: int, rank: int) -> bool:
        allowed = self.allowed_ranks[table]
        return allowed is None or rank in allowed

    def run(self, local_search: bool = True) -> Tuple[Dict[int, Assignment], List[int], SearchState]:
        """Greedy + local search, then restarts (other orders / scores) on small instances; the best plan wins."""
        assignments, unplaced, state = self._run_once(local_search, self.default_order(), bound=True)
        if not local_search or self.objective != "time":
            return assignments, unplaced, state
        for order, bound in self._restarts():
            if self.past_deadline():
                break
            other = self._run_once(local_search, order, bound)
            if len(other[1]) < len(unplaced) or (len(other[1]) == len(unplaced) and not other[1]
                                                 and less(measure(other[2].time), measure(state.time))):
                assignments, unplaced, state = other
        return assignments, unplaced, state

    def past_deadline(self) -> bool:
        """True (and `timed_out` set) once the planner's timeout_seconds has run out."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.timed_out = True
        return self.timed_out

    def _restarts(self) -> List[Tuple[List[int], bool]]:
        """(order, use the bound) of the restarts worth their time at this size (tables x ranks): below
        TINY_INSTANCE both; below SMALL_INSTANCE only biggest-memory-first, the one that still wins there."""
        size = len(self.options) * self.W
        restarts = []
        if size <= TINY_INSTANCE:
            restarts.append((self.default_order(), False))
        if size <= SMALL_INSTANCE:
            by_memory = sorted(range(len(self.options)), key=lambda t: (-min(
                o.peak_bytes for o in self.options[t] if o.time_ms is not None), t))
            restarts.append((by_memory, True))
        return restarts

    def _run_once(self, local_search: bool, order: Sequence[int],
                  bound: bool) -> Tuple[Dict[int, Assignment], List[int], SearchState]:
        self._use_bound = bound
        try:
            assignments, unplaced, state = self.greedy(order)
        finally:
            self._use_bound = True
        if unplaced and self.objective != "memory":
            # the time-first greedy can paint itself into a corner: retry packing by memory, then balance time
            packer = Searcher(self.topology, self.options, "memory", self.hbm_base, self.ddr_base, self.allowed_ranks,
                              self.fill)
            packed, still_unplaced, packed_state = packer.greedy()
            if len(still_unplaced) < len(unplaced):
                assignments, unplaced, state = packed, still_unplaced, packed_state
        if local_search and not unplaced:
            state = self.local_search(assignments, state)
        return assignments, unplaced, state


def _speed_sorted(options: Sequence[ShardingOption]) -> List[ShardingOption]:
    return sorted(options, key=lambda o: o.speed_rank)


def _argmin_lex(keys: Sequence[np.ndarray], ok: np.ndarray) -> int:
    """Index of the lexicographically smallest (keys[0][i], keys[1][i], ..., i) among ok[i]; -1 if none is ok."""
    first = np.where(ok, keys[0], np.inf)
    best = first.min()
    if best == np.inf:
        return -1
    candidates = np.flatnonzero(first <= best + REL_TOL * max(abs(best), 1e-30))
    for key in keys[1:]:
        if len(candidates) == 1:
            break
        values = key[candidates]
        best = values.min()
        candidates = candidates[values <= best + REL_TOL * max(abs(best), 1e-30)]
    return int(candidates[0])
