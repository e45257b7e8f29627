"""The search's running totals and its vectorized candidate pricing, against brute-force loops."""

import itertools

import numpy as np
import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.enumerate import enumerate_options
from rectoolkit.planner.search import Searcher
from rectoolkit.planner.stats import WorkloadStats
from rectoolkit.planner.state import (Assignment, SearchState, TableLoads, host_candidates, measure,
                                      neighbour_maxima, rank_candidates)
from rectoolkit.planner.tables import collect_tables
from rectoolkit.planner.topology import Topology

SHAPES = [(1, 1), (2, 1), (2, 2), (4, 4), (6, 3), (8, 2), (8, 8), (9, 3)]


@pytest.mark.parametrize("world_size,local_world_size", SHAPES)
def test_neighbour_maxima_and_candidates_equal_loops(world_size, local_world_size):
    rng = np.random.default_rng(world_size * 10 + local_world_size)
    L = local_world_size
    for _ in range(20):
        values = rng.choice([0.0, 1.0, 2.5, 3.0], size=world_size) + rng.random(world_size) * rng.integers(0, 2)
        mates, others = neighbour_maxima(values, L)
        for rank in range(world_size):
            host = rank // L
            same = [values[r] for r in range(world_size) if r // L == host and r != rank]
            other = [values[r] for r in range(world_size) if r // L != host]
            assert mates[rank] == (max(same) if same else -np.inf)
            assert others[rank] == (max(other) if other else -np.inf)
        owner, mate, outside = rng.random(3)
        got = rank_candidates(values, owner, mate, outside, L)
        for k in range(world_size):
            after = values + np.where(np.arange(world_size) // L == k // L, mate, outside)
            after[k] = values[k] + owner
            assert got[k] == pytest.approx(after.max())
        inside = rng.random(L)
        got = host_candidates(values, inside, outside, L)
        for h in range(world_size // L):
            after = values + outside
            after[h * L:(h + 1) * L] = values[h * L:(h + 1) * L] + inside
            assert got[h] == pytest.approx(after.max())


def test_state_views_follow_changes_and_copies_are_independent():
    topo = Topology(world_size=4, local_world_size=2, compute_device="cuda", hbm_cap=1000.0)
    state = SearchState(topo, hbm_base=5.0)
    vectors = np.arange(12, dtype=float).reshape(3, 4)
    state.add(vectors)
    assert state.time.tolist() == [0, 1, 2, 3] and state.hbm.tolist() == [9, 10, 11, 12]
    other = state.copy()
    other.add(vectors, -1.0)
    assert other.hbm.tolist() == [5, 5, 5, 5] and state.hbm.tolist() == [9, 10, 11, 12]
    assert measure(np.array([1.0, 3.0, 3.0, 2.0])) == (3.0, 2)


def _searcher(pooling_factors, world_size=4, local_world_size=2):
    topo = Topology(world_size=world_size, local_world_size=local_world_size, compute_device="cuda",
                    hbm_cap=10**9, batch_size=64)
    configs = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 * (i + 1), embedding_dim=32,
                                  feature_names=[f"f{i}"]) for i in range(len(pooling_factors))]
    tables = collect_tables(configs, 64, stats=WorkloadStats(
        {f"f{i}": float(p) for i, p in enumerate(pooling_factors)}))
    model = CostModel(topo)
    options = [enumerate_options(t, i, topo) for i, t in enumerate(tables)]
    return Searcher(topo, options, fill=lambda batch: model.fill_many(batch, [tables[o.table_index] for o in batch]))


def test_swap_pricing_equals_applying_the_swap():
    """_try_swaps prices all swaps at once; the state it returns equals removing and re-adding the two tables."""
    searcher = _searcher([10, 12, 14, 16, 1, 2])  # ids per sample: the time a table adds to its rank
    table_wise = [next(o for o in opts if o.sharding_type.value == "table_wise") for opts in searcher.options]
    # four heavy tables on rank 0, two light ones on rank 3: swapping a heavy one for a light one helps
    assignments = {t: Assignment(table_wise[t], (0,)) for t in range(4)}
    assignments.update({4: Assignment(table_wise[4], (3,)), 5: Assignment(table_wise[5], (3,))})
    state = searcher.new_state()
    for a in assignments.values():
        state.apply(a)
    before = dict(assignments)
    current = measure(state.time)
    loads = TableLoads(state, assignments, len(assignments))
    on_rank = loads.tables_on(0, 16)
    # by time on rank 0, largest (most ids) first; tables 4 and 5 add only their communication there
    assert on_rank == [3, 2, 1, 0, 5, 4] and loads.tables_on(0, 16, owners_only=True) == [3, 2, 1, 0]
    swapped = searcher._try_swaps(assignments, state, 0, on_rank, current, loads)
    assert swapped is not None
    changed = [t for t in assignments if assignments[t].locations != before[t].locations]
    assert len(changed) == 2
    expected = searcher.new_state()
    for a in assignments.values():
        expected.apply(a)
    np.testing.assert_allclose(swapped.load, expected.load, rtol=1e-12)
    assert measure(swapped.time) < current
    # and it is the best single swap: no (table on 0, table elsewhere) exchange does better
    best = None
    for a, b in itertools.product(range(4), (4, 5)):
        trial = dict(before)
        trial[a], trial[b] = Assignment(table_wise[a], (3,)), Assignment(table_wise[b], (0,))
        s = searcher.new_state()
        for x in trial.values():
            s.apply(x)
        best = measure(s.time) if best is None or measure(s.time) < best else best
    assert measure(swapped.time)[0] == pytest.approx(best[0])


def test_table_loads_rank_tables_like_a_loop():
    """tables_on equals sorting every table by its time on the rank (ties by index), owners only on request."""
    searcher = _searcher([3, 1, 3, 2, 5, 1, 3], world_size=4, local_world_size=2)
    rng = np.random.default_rng(0)
    assignments = {}
    for t, opts in enumerate(searcher.options):
        option = opts[int(rng.integers(len(opts)))]
        searcher.ensure_costs(option)
        sites = searcher.W if option.kind == "rank" else searcher.H
        assignments[t] = Assignment(option, tuple(int(rng.integers(sites)) for _ in range(option.num_groups))
                                    if option.kind != "fixed" else ())
    state = searcher.new_state()
    loads = TableLoads(state, assignments, len(assignments))
    for rank in range(4):
        rows = []
        for t, a in assignments.items():
            v = state.assignment_vectors(a, cache=False)
            if v[0, rank] > 0:
                rows.append((-v[0, rank], t, v[1, rank] + v[2, rank] > 0))
        rows.sort()
        for limit in (2, 5, 16):
            assert loads.tables_on(rank, limit) == [t for _, t, _ in rows][:limit]
            assert loads.tables_on(rank, limit, owners_only=True) == [t for _, t, owns in rows if owns][:limit]
