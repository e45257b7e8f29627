"""Sharded inference: quantized collections (bags, sequences) split table-, row- and column-wise over 2 gloo
workers, and a model holding both traced by rectoolkit.fx."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "distributed"))
from dist_harness import run_workers  # noqa: E402
from quant_dist_workers import sharded_inference_worker, sharded_quant_ec_worker  # noqa: E402


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_sharded_quantized_ebc_equals_unsharded(tmp_path):
    result_file = str(tmp_path / "results")
    run_workers(sharded_inference_worker, 2, result_file)
    rows = [r for rank in range(2) for r in json.load(open(f"{result_file}.{rank}"))]
    assert len(rows) == 12
    for row in rows:
        # every shard holds the stored bytes (column blocks: their codes with each row's scale and bias), so the
        # pooled values equal the unsharded ones up to summation order
        assert row["max_diff_vs_unsharded"] <= 1e-6, row
        # every column equals the sum of the dequantized rows (an independent float collection)
        assert row["max_diff"] <= 1e-5, row
    # int8 rows of dim 16: 4 + 16 -> 32 bytes, of dim 8: 4 + 8 -> 16; rank 0 holds half of t_rw, a t_cw block, t_mean
    int8_rank0 = next(r for r in rows if r["rank"] == 0 and "int8" in r["dtype"])
    assert int8_rank0["quantized_bytes"] == 25 * 32 + 30 * 32 + 20 * 16
    # mixed types (issue 12), rank 0: t_rw INT4 16 cols 4 + 8 -> 16 bytes, t_cw INT2 block of 16 cols 4 + 4 -> 16,
    # t_mean FP32 8 cols 32 bytes
    mixed_rank0 = next(r for r in rows if r["rank"] == 0 and r["dtype"] == "mixed")
    assert mixed_rank0["quantized_bytes"] == 25 * 16 + 30 * 16 + 20 * 32


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_sharded_quantized_ec_equals_unsharded_and_traces(tmp_path):
    result_file = str(tmp_path / "results")
    run_workers(sharded_quant_ec_worker, 2, result_file)
    rows = [r for rank in range(2) for r in json.load(open(f"{result_file}.{rank}"))]
    assert [r["what"] for r in rows] == ["torch.int8", "torch.quint4x2", "torch.float16", "mixed", "fx"] * 2
    for row in rows[:4] + rows[5:9]:
        assert row["keys"] == ["a", "b", "c", "d"], row
        # every id reads its stored row (column blocks: the codes of their columns with the row's scale and bias)
        assert row["equal_unsharded"] and row["equal_reference"], row
    # rank 0 holds half of t_rw (25 rows) and the second 8-column block of t_cw (30 rows); rows padded to 16 bytes:
    # int8 16 cols 4 + 16 -> 32 bytes, 8 cols 4 + 8 -> 16; int4 4 + 8 -> 16, 4 + 4 -> 16; fp16 32 -> 32, 16 -> 16;
    # mixed (issue 12): t_rw INT2 4 + 4 -> 16, t_cw INT4 4 + 4 -> 16
    assert [r["quantized_bytes"] for r in rows[:4]] == [25 * 32 + 30 * 16, 25 * 16 + 30 * 16, 25 * 32 + 30 * 16,
                                                        25 * 16 + 30 * 16]
    for fx in (rows[4], rows[9]):
        assert fx["sharded_types"] == ["ShardedQuantEmbeddingBagCollection", "ShardedQuantEmbeddingCollection"], fx
        assert fx["leaves"] == ["bags._run_groups", "sequences._run_groups"], fx  # each sharded module, one call
        assert fx["pooled_diff"] <= 1e-5 and fx["rows_equal"], fx
