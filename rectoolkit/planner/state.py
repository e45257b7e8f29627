"""The search's running totals: per-rank time, HBM and DDR of the tables placed so far, and the vectors
one option adds at one location.

Costs are additive per rank, so a partial plan is one [3, W] array (rows: time ms, HBM bytes, DDR bytes)
and placing or removing a table is one vector addition. An option's templates (see
rectoolkit.planner.cost.CostModel.fill_many) expand to that vector for a location:

* kind "rank" (one shard per group): owner time on the rank, host-mate time on the rest of its host,
  outside time elsewhere; memory on the owner only;
* kind "host" (a group's row blocks on the ranks of one host): inside[l] on rank l of the host, outside
  elsewhere; memory inside[l];
* kind "fixed" (ROW_WISE, DATA_PARALLEL): the [W] vectors as they are.

    >>> from rectoolkit.planner.topology import Topology
    >>> state = SearchState(Topology(world_size=4, local_world_size=2, compute_device="cuda"))
    >>> state.load.shape, state.time.shape
    ((3, 4), (4,))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from rectoolkit.planner.enumerate import ShardingOption
from rectoolkit.planner.topology import Topology

TIME, HBM, DDR = 0, 1, 2  # rows of SearchState.load
REL_TOL = 1e-9


@dataclass
class Assignment:
    """A table's chosen option and the location (rank or host) of each of its groups."""

    option: ShardingOption
    locations: Tuple[int, ...]
    vectors: Optional[np.ndarray] = field(default=None, repr=False, compare=False)  # [3, W], set on first use


class SearchState:
    """Per-rank time / HBM / DDR of the tables placed so far (`load`, with `time`, `hbm`, `ddr` as its rows).
    Plain attributes, not properties: the search reads them millions of times."""

    def __init__(self, topology: Topology, hbm_base: float = 0.0, ddr_base: float = 0.0) -> None:
        self.W, self.L, self.H = topology.world_size, topology.local_world_size, topology.num_hosts
        self.uses_hbm = topology.uses_hbm
        load = np.zeros((3, self.W))
        load[HBM], load[DDR] = float(hbm_base), float(ddr_base)
        self.bind(load)
        self.hbm_cap = np.array(topology.hbm_caps(), dtype=float)
        self.ddr_cap = np.array(topology.ddr_caps(), dtype=float)
        self.hbm_limit, self.ddr_limit = cap_limit(self.hbm_cap), cap_limit(self.ddr_cap)
        self.total_bytes = 0.0

    def bind(self, load: np.ndarray) -> None:
        """Take `load` as the state's [3, W] array; `time`, `hbm`, `ddr` are views of its rows."""
        self.load = load
        self.time, self.hbm, self.ddr = load[TIME], load[HBM], load[DDR]
        self._stats = None

    def copy(self) -> "SearchState":
        other = object.__new__(SearchState)
        other.__dict__.update(self.__dict__)
        other.bind(self.load.copy())
        return other

    def host_stats(self) -> Tuple[np.ndarray, np.ndarray]:
        """(largest time among each rank's host-mates, largest time on the other hosts), cached until changed."""
        if self._stats is None:
            self._stats = neighbour_maxima(self.time, self.L)
        return self._stats

    def add(self, vectors: np.ndarray, sign: float = 1.0) -> None:
        """Add (or with sign=-1 remove) a [3, W] time/HBM/DDR vector."""
        if sign == 1.0:
            self.load += vectors
        else:
            self.load -= vectors
        self._stats = None

    def vectors(self, option: ShardingOption, location: int) -> np.ndarray:
        """[3, W] time/HBM/DDR that one group of `option` adds at `location` (a rank or a host)."""
        W, L = self.W, self.L
        if option.kind == "fixed":
            return fixed_vectors(option)
        out = np.zeros((3, W))
        if option.kind == "rank":
            owner, mate, outside = option.time_ms
            host = location // L
            out[TIME] = outside
            out[TIME, host * L:(host + 1) * L] = mate
            out[TIME, location] = owner
            out[HBM, location], out[DDR, location] = option.hbm_bytes, option.ddr_bytes
        else:
            inside, outside = option.time_ms
            out[TIME] = outside
            out[:, location * L:(location + 1) * L] = (inside, option.hbm_bytes, option.ddr_bytes)
        return out

    def rank_vectors(self, options: Sequence[ShardingOption], locations: Sequence[int]) -> np.ndarray:
        """[n, 3, W]: `vectors(options[i], locations[i])` for single-group options of kind "rank", at once."""
        n = len(options)
        owner, mate, outside = np.array([o.time_ms for o in options]).T
        locations = np.asarray(locations)
        same_host = (np.arange(self.W) // self.L)[None, :] == (locations // self.L)[:, None]
        out = np.zeros((n, 3, self.W))
        out[:, TIME] = np.where(same_host, mate[:, None], outside[:, None])
        rows = np.arange(n)
        out[rows, TIME, locations] = owner
        out[rows, HBM, locations] = [o.hbm_bytes for o in options]
        out[rows, DDR, locations] = [o.ddr_bytes for o in options]
        return out

    def assignment_vectors(self, assignment: Assignment, cache: bool = True) -> np.ndarray:
        """[3, W] of a whole assignment (every group); kept on the Assignment unless cache=False."""
        if assignment.vectors is not None:
            return assignment.vectors
        option = assignment.option
        if option.kind == "fixed":
            total = fixed_vectors(option)
        else:
            total = np.zeros((3, self.W))
            for location in assignment.locations:
                total += self.vectors(option, location)
            if option.host_count_bytes:
                total += self.count_vectors(option, assignment.locations)
        if cache:
            assignment.vectors = total
        return total

    def count_vectors(self, option: ShardingOption, hosts: Sequence[int]) -> np.ndarray:
        """[3, W]: the time of a host option's VBE count headers (ShardingOption.host_count_ms), once per host in
        `hosts`; they take no memory."""
        inside, outside = option.host_count_ms
        out = np.zeros((3, self.W))
        for host in set(hosts):
            out[TIME] += outside
            out[TIME, host * self.L:(host + 1) * self.L] += inside - outside
        return out

    def apply(self, assignment: Assignment, sign: float = 1.0) -> None:
        self.add(self.assignment_vectors(assignment), sign)
        self.total_bytes += sign * assignment_bytes(assignment.option, assignment.locations)

    def primary_memory(self) -> Tuple[np.ndarray, np.ndarray]:
        """(bytes used, capacity) of the memory shards live in: HBM on cuda, DDR on cpu."""
        if self.uses_hbm:
            return self.hbm, np.maximum(self.hbm_cap, 1.0)
        return self.ddr, np.maximum(self.ddr_cap, 1.0)

    def memory_fraction(self) -> np.ndarray:
        used, cap = self.primary_memory()
        return used / cap


class TableLoads:
    """Every placed table's time on each rank and the ranks where it holds shards: which tables to move off
    a rank, largest first, without a loop over all tables ([tables, W] arrays, updated per change)."""

    def __init__(self, state: SearchState, assignments: Dict[int, Assignment], num_tables: int) -> None:
        self.state = state
        self.time = np.zeros((num_tables, state.W))
        self.owns = np.zeros((num_tables, state.W), dtype=bool)
        for table, assignment in assignments.items():
            self.set(table, assignment)

    def set(self, table: int, assignment: Assignment) -> None:
        vectors = self.state.assignment_vectors(assignment, cache=False)
        self.time[table] = vectors[TIME]
        self.owns[table] = (vectors[HBM] + vectors[DDR]) > 0

    def tables_on(self, rank: int, limit: int, owners_only: bool = False) -> List[int]:
        """Up to `limit` tables by their time on `rank`, largest first, ties by table index (owners_only:
        only tables with a shard there)."""
        load = self.time[:, rank]
        keep = load > 0
        if owners_only:
            keep &= self.owns[:, rank]
        tables = np.flatnonzero(keep)
        if len(tables) > limit:  # the top `limit` values and anything tied with the last of them
            values = load[tables]
            tables = tables[values >= np.partition(values, len(values) - limit)[len(values) - limit]]
        order = np.lexsort((tables, -load[tables]))
        return tables[order][:limit].tolist()


def assignment_bytes(option: ShardingOption, locations: Sequence[int]) -> float:
    """Off-diagonal bytes an option moves per step at these locations: its groups', plus a host option's VBE count
    headers once per host."""
    return option.total_bytes + len(set(locations)) * option.host_count_bytes if option.kind == "host" \
        else option.total_bytes


def fixed_vectors(option: ShardingOption) -> np.ndarray:
    """The [3, W] vectors of a ROW_WISE / DATA_PARALLEL option (stacked once per option)."""
    if option.fixed_vectors is None:
        option.fixed_vectors = np.stack([option.time_ms, option.hbm_bytes, option.ddr_bytes])
    return option.fixed_vectors


def cap_limit(cap: np.ndarray) -> np.ndarray:
    """A capacity with a rounding allowance (sums of floats may land a hair above an exact fit)."""
    return cap * (1 + 1e-12) + 1e-6


def measure(time: np.ndarray) -> Tuple[float, int]:
    """(slowest rank's time, number of ranks at it): the local search lowers this lexicographically."""
    slowest = float(time.max())
    return slowest, int(np.count_nonzero(time >= slowest * (1 - REL_TOL)))


def less(a, b) -> bool:
    """Lexicographic a < b with a relative tolerance on each entry."""
    for x, y in zip(a, b):
        tol = REL_TOL * max(abs(x), abs(y), 1e-30)
        if x < y - tol:
            return True
        if x > y + tol:
            return False
    return False


# ---- vectorized candidate pricing ------------------------------------------------------------------------
def max_other_hosts(host_max: np.ndarray) -> np.ndarray:
    """For each host, the largest value among the other hosts (-inf when there is one host)."""
    H = len(host_max)
    if H == 1:
        return np.full(1, -np.inf)
    order = np.argsort(host_max, kind="stable")
    best, second = order[-1], order[-2]
    out = np.full(H, host_max[best])
    out[best] = host_max[second]
    return out


def neighbour_maxima(values: np.ndarray, L: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per rank: the largest value among its host-mates, and the largest on other hosts (-inf if none)."""
    W = len(values)
    H = W // L
    if H == 1 and W > 1:  # one host (the common notebook case): the largest of the others, no other hosts
        top = int(values.argmax())
        mates = np.full(W, values[top])
        mates[top] = np.partition(values, W - 2)[W - 2]
        return mates, np.full(W, -np.inf)
    grid = values.reshape(H, L)
    host_max = grid.max(axis=1)
    if L > 1:
        second = np.partition(grid, L - 2, axis=1)[:, L - 2]
        mates = np.repeat(host_max, L)
        mates[np.arange(H) * L + grid.argmax(axis=1)] = second
    else:
        mates = np.full(W, -np.inf)
    others = np.repeat(max_other_hosts(host_max), L)
    return mates, others


def rank_candidates(values: np.ndarray, owner, mate: float, outside: float, L: int,
                    neighbours: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> np.ndarray:
    """Slowest value after adding (owner at k, mate on k's host-mates, outside elsewhere), for every rank k."""
    mates, others = neighbours if neighbours is not None else neighbour_maxima(values, L)
    return np.maximum(np.maximum(values + owner, mates + mate), others + outside)


def host_candidates(values: np.ndarray, inside: np.ndarray, outside: float, L: int) -> np.ndarray:
    """Slowest value after adding inside[l] to rank l of host h and outside elsewhere, for every host h."""
    H = len(values) // L
    grid = values.reshape(H, L)
    result = (grid + inside[None, :]).max(axis=1)
    if H > 1:
        result = np.maximum(result, max_other_hosts(grid.max(axis=1)) + outside)
    return result
