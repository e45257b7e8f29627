"""`benchmarks/bench_embeddings.py --device cuda` runs end to end on a small workload and writes its table
(the figures themselves come from a full run; tests never assert on time)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from gpu_helpers import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.timeout(600)
def test_bench_embeddings_on_the_gpu_writes_its_table(tmp_path, device):
    workload = {"name": "tiny", "batch_size_per_rank": 64, "dense_features": 0,
                "id_distribution": {"kind": "zipf", "alpha": 1.05},
                "tables": [{"name": f"t{i}", "num_embeddings": 5000, "embedding_dim": 32, "feature_names": [f"f{i}"],
                            "pooling_factor": 4.0} for i in range(4)]}
    (tmp_path / "tiny.json").write_text(json.dumps(workload))
    spec = importlib.util.spec_from_file_location("bench_embeddings", REPO / "benchmarks" / "bench_embeddings.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "table.md"
    table = bench.main(["--device", str(device), "--workload", str(tmp_path / "tiny.json"), "--batch", "64",
                        "--iters", "2", "--rounds", "1", "--ab-steps", "0", "--out", str(out)])
    assert out.read_text().strip() == table.strip()
    assert f"{device.type} copy bandwidth" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    for contender in ("rectoolkit EBC, pure-torch kernel (fused SGD)", "loop of nn.EmbeddingBag (dense grads + SGD)"):
        assert contender in rows and "n/a" not in rows[contender], table
