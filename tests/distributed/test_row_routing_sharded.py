"""Row-block routing by numbering and sorting ids (row_wise.block_ids on many ids on CPU) through the sharded
collections on 2 gloo ranks: ROW_WISE, TABLE_ROW_WISE, GRID_SHARD and a mixed plan, pooled and sequence, weighted,
fused, and with a batch size per feature (VBE): outputs, gradients, updated weights and bytes equal the unsharded
collection's (the workers assert it; each case reports a row)."""

from __future__ import annotations

import json
import os

import pytest

from dist_harness import run_workers
from dist_routing_workers import numbered_equivalence_worker, numbered_vbe_worker


EQUIVALENCE = [("row_wise", 2), ("table_row_wise", 2), ("grid_shard", 1), ("mixed_a", 2)]
VBE = [("row_wise", 2), ("table_row_wise_last+plain", 2), ("grid_shard", 1), ("ec:row_wise", 2)]


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
@pytest.mark.parametrize("worker, cases, rows_per_case", [
    (numbered_equivalence_worker, EQUIVALENCE, lambda case: 5),  # bag (plain, weighted, fused), sequence (plain, fused)
    (numbered_vbe_worker, VBE, lambda case: 1 if case.startswith("ec:") else 2),  # bag (plain, weighted), sequence
], ids=["plain batches", "a batch size per feature"])
def test_numbered_routing_equals_unsharded(tmp_path, worker, cases, rows_per_case):
    result_file = os.path.join(tmp_path, "results.jsonl")
    run_workers(worker, 2, cases, result_file)
    rows = [json.loads(line) for line in open(result_file)]
    assert [r["case"] for r in rows] == [case for case, _ in cases for _ in range(rows_per_case(case))]
