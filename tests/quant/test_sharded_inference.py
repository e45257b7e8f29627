"""Sharded inference: a quantized collection split table-, row- and column-wise over 2 gloo workers."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))
from quant_dist_workers import sharded_inference_worker  # noqa: E402


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_sharded_quantized_ebc_equals_unsharded(tmp_path):
    result_file = str(tmp_path / "results")
    mp.start_processes(sharded_inference_worker, args=(2, str(tmp_path / "rendezvous"), result_file), nprocs=2,
                       join=True, start_method="spawn")
    rows = [r for rank in range(2) for r in json.load(open(f"{result_file}.{rank}"))]
    assert len(rows) == 8
    for row in rows:
        # table-wise and row-wise shards hold the very same bytes: equal up to summation order
        assert row["max_diff_vs_unsharded_tw_rw"] <= 1e-6, row
        # every column equals the sum of the dequantized rows (column-wise blocks quantized block by block)
        assert row["max_diff"] <= 1e-5, row
    # int8 rows of dim 16: 4 + 16 -> 32 bytes, of dim 8: 4 + 8 -> 16; rank 0 holds half of t_rw, a t_cw block, t_mean
    int8_rank0 = next(r for r in rows if r["rank"] == 0 and "int8" in r["dtype"])
    assert int8_rank0["quantized_bytes"] == 25 * 32 + 30 * 32 + 20 * 16
