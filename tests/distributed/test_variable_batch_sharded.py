"""A batch size per feature (VBE) through the sharded EmbeddingBagCollection on 2 gloo ranks, every sharding type:
outputs (expanded with the inverse indices) and gradients equal the unsharded collection's, bytes equal
traffic.py's (ids deduplicated; every routed type sends each feature's own bags and gets its pooled rows back at its
own batch size, through both output levels for the two-level types, checked by hand too)."""

from __future__ import annotations

import json
import os

import pytest

from dist_harness import run_workers
from dist_vbe_workers import vbe_fused_worker, vbe_worker

# (plan, ranks per host): one host of 2 ranks (the two-level types: partial sums of both ranks added by the
# gateway; "table_row_wise_last": rank 0 is a gateway that owns nothing, "+plain": rank 1's batch is a plain one
# beside rank 0's VBE batch), then 2 hosts of 1 rank for the two-level types (the reduced sums cross hosts)
CASES = [(kind, 2) for kind in ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed_a",
                                "table_row_wise", "grid_shard", "table_row_wise_last",
                                "table_row_wise_last+plain"]] + \
    [("table_row_wise", 1), ("grid_shard", 1), ("mixed_b", 1)]
# the EmbeddingCollection: the one-level types (TABLE_WISE, ROW_WISE, COLUMN_WISE also compared with TorchRec's
# sharded one), then the two-level ones
EC_CASES = [("ec:" + kind, 2) for kind in ["table_wise", "row_wise", "column_wise", "mixed_a", "table_row_wise"]] + \
    [("ec:grid_shard", 1)]


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_two_ranks_vbe_equals_unsharded(tmp_path):
    pytest.importorskip("torchrec")
    result_file = os.path.join(tmp_path, "results.jsonl")
    run_workers(vbe_worker, 2, CASES + EC_CASES, result_file)
    rows = [json.loads(line) for line in open(result_file)]
    assert [(r["case"], r["weighted"]) for r in rows] == \
        [(c, w) for c, _ in CASES for w in (False, True)] + [(c, False) for c, _ in EC_CASES]
    assert all(r["output_rows"] == [5, 6] for r in rows)
    compared = [r["case"] for r in rows if r.get("torchrec_diff") is not None]
    assert compared == ["ec:table_wise", "ec:row_wise", "ec:column_wise"]


# 4 ranks on 2 hosts of 2: the two-level types (partial sums added inside a host, reduced sums across; grid_shard puts
# two column blocks of t2 on host 0, whose gateways hear its counts once) and a one-level type across both hosts
FOUR_RANK_CASES = [("table_row_wise", 2), ("grid_shard", 2), ("row_wise", 2)]


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_four_ranks_two_hosts_vbe_equals_unsharded(tmp_path):
    """Every rank's VBE batch has its own per-feature batch sizes; outputs, gradients and the fused-SGD update equal
    the unsharded collection's on all ranks' batches, and every collective's bytes equal step_traffic's (the
    workers assert all of it and rank 0 reports each check)."""
    result_file = os.path.join(tmp_path, "results.jsonl")
    run_workers(vbe_fused_worker, 4, FOUR_RANK_CASES, result_file)
    rows = [json.loads(line) for line in open(result_file)]
    assert [(r["case"], r.get("weighted")) for r in rows] == \
        [(c, w) for c, _ in FOUR_RANK_CASES for w in (False, True, None)]
    assert all(r["output_rows"] == [5, 6, 7, 8] for r in rows if "output_rows" in r)
    assert all(r["fused_sgd_diff"] <= 1e-5 for r in rows if "fused_sgd_diff" in r)


@pytest.mark.timeout(60)
def test_one_rank(tmp_path):
    result_file = os.path.join(tmp_path, "results.jsonl")
    vbe_worker(0, 1, [("table_wise", 1), ("row_wise", 1)], result_file)
    assert len(open(result_file).read().splitlines()) == 4
