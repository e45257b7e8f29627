"""A batch size per feature (VBE) through the sharded EmbeddingBagCollection on 2 gloo ranks, every sharding type:
outputs (expanded with the inverse indices) and gradients equal the unsharded collection's, bytes equal
traffic.py's (ids deduplicated; every routed type sends each feature's own bags and gets its pooled rows back at its
own batch size, through both output levels for the two-level types, checked by hand too)."""

from __future__ import annotations

import json
import os

import pytest

from dist_harness import run_workers
from dist_vbe_workers import vbe_worker

# (plan, ranks per host): one host of 2 ranks (the two-level types: partial sums of both ranks added by the
# gateway), then 2 hosts of 1 rank for the two-level types (the reduced sums cross hosts)
CASES = [(kind, 2) for kind in ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed_a",
                                "table_row_wise", "grid_shard"]] + \
    [("table_row_wise", 1), ("grid_shard", 1), ("mixed_b", 1)]


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_two_ranks_vbe_equals_unsharded(tmp_path):
    result_file = os.path.join(tmp_path, "results.jsonl")
    run_workers(vbe_worker, 2, CASES, result_file)
    rows = [json.loads(line) for line in open(result_file)]
    assert [(r["case"], r["weighted"]) for r in rows] == [(c, w) for c, _ in CASES for w in (False, True)]
    assert all(r["output_rows"] == [5, 6] for r in rows)


@pytest.mark.timeout(60)
def test_one_rank(tmp_path):
    result_file = os.path.join(tmp_path, "results.jsonl")
    vbe_worker(0, 1, [("table_wise", 1), ("row_wise", 1)], result_file)
    assert len(open(result_file).read().splitlines()) == 4
