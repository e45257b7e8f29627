"""The exact optimum of small planning instances, by branch and bound, to check the search against.

Every option of every table at every placement (groups of one option are identical, so location
multisets suffice); a node is pruned when max(slowest rank so far, (time so far + the least time the
remaining tables need) / W) cannot beat the best plan found.
"""

from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Tuple

import numpy as np

from rectoolkit.planner.search import Searcher
from rectoolkit.planner.state import DDR, HBM, TIME, Assignment, cap_limit

def exhaustive_search(searcher: Searcher, upper_bound: float = np.inf,
                      max_evaluations: int = 20_000_000) -> Tuple[float, Optional[Dict[int, Assignment]]]:
    """The minimum slowest-rank time over every option and placement (branch and bound; small instances).

    Lower bound at a node: max(slowest rank so far, (all time so far + the least time the remaining tables
    need) / W). Returns (optimum, assignments); (inf, None) if nothing fits or nothing beats upper_bound.
    Raises RuntimeError after max_evaluations candidate evaluations.
    """
    tables = searcher.default_order()
    W, H = searcher.W, searcher.H
    probe = searcher.new_state()
    choices = []  # per table: (assignment, time, hbm, ddr vectors, time total)
    for table in tables:
        table_choices = []
        for option in searcher.options[table]:
            searcher.ensure_costs(option)
            if option.kind == "fixed":
                combos = [(0,)]
            else:
                sites = range(W) if option.kind == "rank" else range(H)
                if option.kind == "rank" and searcher.allowed_ranks[table] is not None:
                    sites = sorted(set(searcher.allowed_ranks[table]))
                # groups of one option are identical, so location multisets suffice
                combos = list(itertools.combinations_with_replacement(sites, option.num_groups))
                if option.one_host:  # TABLE_COLUMN_WISE: every block on one host
                    L = searcher.L
                    combos = [combo for combo in combos if len({rank // L for rank in combo}) == 1]
            for combo in combos:
                assignment = Assignment(option, combo)
                load = probe.assignment_vectors(assignment)
                table_choices.append((assignment, load[TIME], load[HBM], load[DDR], float(load[TIME].sum())))
        choices.append(table_choices)
    least_left = [0.0] * (len(tables) + 1)
    for depth in range(len(tables) - 1, -1, -1):
        least_left[depth] = least_left[depth + 1] + min(c[4] for c in choices[depth])
    hbm_cap, ddr_cap = cap_limit(probe.hbm_cap), cap_limit(probe.ddr_cap)
    best = [upper_bound * (1 + 1e-9), None]
    evaluations = [0]
    chosen: List[Assignment] = []

    def visit(depth: int, time: np.ndarray, hbm: np.ndarray, ddr: np.ndarray, total: float) -> None:
        if depth == len(tables):
            value = float(time.max())
            if value < best[0]:
                best[0], best[1] = value, {tables[i]: a for i, a in enumerate(chosen)}
            return
        evaluations[0] += len(choices[depth])
        if evaluations[0] > max_evaluations:
            raise RuntimeError(f"exhaustive_search: more than {max_evaluations} evaluations; use a smaller instance")
        children = []
        for index, (assignment, t, h, d, tot) in enumerate(choices[depth]):
            new_hbm, new_ddr = hbm + h, ddr + d
            if np.any(new_hbm > hbm_cap) or np.any(new_ddr > ddr_cap):
                continue
            new_time = time + t
            bound = max(float(new_time.max()), (total + tot + least_left[depth + 1]) / W)
            if bound < best[0]:
                children.append((bound, index, new_time, new_hbm, new_ddr, total + tot))
        children.sort(key=lambda c: (c[0], c[1]))
        for bound, index, new_time, new_hbm, new_ddr, new_total in children:
            if bound >= best[0]:
                break
            chosen.append(choices[depth][index][0])
            visit(depth + 1, new_time, new_hbm, new_ddr, new_total)
            chosen.pop()

    visit(0, probe.time.copy(), probe.hbm.copy(), probe.ddr.copy(), 0.0)
    return (best[0], best[1]) if best[1] is not None else (np.inf, None)
