"""Sharded collections equal the unsharded ones on the global batch; measured bytes equal traffic.py.

Every case is checked on every rank: outputs, gradients (dense tables) or updated weights (fused Adagrad),
and the rank x rank bytes of every collective after one forward+backward step. The mixed plans (which
together cover all seven types) run with a different local batch size on every rank. Tolerance: 1e-5 absolute
(sums are taken in a different order when row blocks are reduced).
"""

from __future__ import annotations

import json
import os

import pytest

from dist_harness import run_workers
from dist_workers import equivalence_worker, subgroup_equivalence_worker

ALL_TYPES = ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise", "grid_shard",
             "table_column_wise"]


def _run(tmp_path, W, cases):
    result_file = os.path.join(tmp_path, "results.jsonl")
    if W == 1:
        equivalence_worker(0, 1, cases, result_file)
    else:
        run_workers(equivalence_worker, W, cases, result_file)
    rows = [json.loads(line) for line in open(result_file)]
    assert len(rows) == len(cases) * 5  # ebc dense, ebc dense weighted, ebc fused, ec dense, ec fused
    if W > 1:  # the mixed plans ran with a different local batch size on every rank
        assert all(len(set(r["batch_sizes"])) == W for r in rows if r["case"].startswith("mixed")), rows
    return rows


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_two_ranks_every_type_and_mixed(tmp_path):
    """One host of 2 ranks (every type, a mixed plan), then 2 hosts of 1 rank (the types bound to a host)."""
    cases = [(kind, 2) for kind in ALL_TYPES + ["mixed_a"]] + [("table_row_wise", 1), ("grid_shard", 1), ("mixed_b", 1),
                                                               ("table_column_wise", 1)]
    rows = _run(tmp_path, 2, cases)
    assert {r["case"] for r in rows} == set(ALL_TYPES + ["mixed_a", "mixed_b"])


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_four_ranks_two_hosts(tmp_path):
    """2 hosts of 2 ranks: TABLE_ROW_WISE and GRID_SHARD (two levels through gateways) beside TABLE_COLUMN_WISE
    (column blocks on one host), RW and DP."""
    rows = _run(tmp_path, 4, [("mixed_b", 2), ("mixed_c", 2)])
    assert all(r["world_size"] == 4 for r in rows)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_groups_of_two_ranks_each_on_its_own_process_group(tmp_path):
    """4 ranks as two worlds of 2 (TorchRec's 2D parallel shards each replica group on a group of its own): every
    type on groups whose ranks are not the global ones (the second group is global ranks 2 and 3)."""
    result_file = os.path.join(tmp_path, "results.jsonl")
    cases = [("mixed_a", 2), ("mixed_b", 1)]
    run_workers(subgroup_equivalence_worker, 4, cases, result_file)
    rows = [json.loads(line) for line in open(result_file)]
    assert sorted((r["group"], r["case"], r["collection"]) for r in rows) == sorted(
        (group, case, collection) for group in (0, 1) for case, _ in cases for collection in ("ebc", "ec"))
    assert all(r["max_output_diff"] <= 1e-5 and r["max_grad_or_weight_diff"] <= 1e-5 for r in rows), rows


@pytest.mark.timeout(60)
def test_one_rank(tmp_path):
    _run(tmp_path, 1, [("table_wise", 1), ("row_wise", 1), ("mixed_a", 1)])
