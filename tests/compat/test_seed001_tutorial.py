"""Seed 001, the "Introduction to TorchRec" tutorial, runs whole on CPU with `import rectoolkit as torchrec`.

tests/compat/seed001_tutorial.py is the tutorial's code cell by cell (cuda -> cpu, nccl -> gloo); it runs in a
process of its own (it starts a one-process gloo group, as the tutorial does) through run_cells.py. TorchRec 1.8
runs 18 of its 20 cells on CPU (the quantized sharding and fx cells need CUDA there).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# the tutorial imports fbgemm's EmbOptimType (its fused_params cell); `make test` installs fbgemm-gpu-cpu
pytestmark = pytest.mark.fbgemm
ROOT = HERE.parent.parent


@pytest.fixture(scope="module")
def cells(tmp_path_factory):
    pytest.importorskip("fbgemm_gpu.split_embedding_configs")
    result = tmp_path_factory.mktemp("seed001") / "cells.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(HERE / "run_cells.py"), str(HERE / "seed001_tutorial.py"), str(result)],
                   env=env, timeout=600, check=True, capture_output=True)
    return json.loads(result.read_text())


def test_every_cell_runs(cells):
    failed = {c["cell"]: c["error"].strip().splitlines()[-1] for c in cells if not c["ok"]}
    assert len(cells) == 20 and not failed, failed


def _stdout(cells, number):
    return cells[number - 1]["stdout"]


def test_sharding_cells_print_what_the_tutorial_shows(cells):
    assert "table_wise" in _stdout(cells, 10) and "fused" in _stdout(cells, 10)  # the plan
    sharded = _stdout(cells, 11)
    assert sharded.startswith("Sharded EBC Module: ShardedEmbeddingBagCollection(")
    for part in ("(lookups):", "(_input_dists):", "(_output_dists):"):
        assert part in sharded
    awaited = _stdout(cells, 12).splitlines()
    assert "EmbeddingBagCollectionAwaitable object" in awaited[0]
    assert awaited[1:] == ["<class 'rectoolkit.sparse.keyed_tensor.KeyedTensor'>", "['product', 'user']",
                           "torch.Size([2, 128])", "product torch.Size([2, 64])", "user torch.Size([2, 64])"]


def test_optimizer_cell_fuses_what_each_way_asks_for(cells):
    out = _stdout(cells, 16)
    lrs = [float(x) for x in re.findall(r"lr: ([0-9.]+)", out)]
    assert lrs == [0.01, 0.02, 0.5]  # TorchRec's default, fused_params, apply_optimizer_in_backward (seed's output)
    assert "Non Fused Model Parameters:\ndict_keys([])" in out
    first, second = (float(x) for x in re.findall(r"Iteration Loss: ([-0-9.e]+)", out))
    # loss = sum(1 - out) over 2 x 128 outputs: one fused row-wise Adagrad step (lr 0.02) raises every touched
    # weight, so the loss falls; by how much depends on the random tables (the seed shows 255.7 -> 245.4)
    assert second < first - 1.0


def test_quantized_cells_shard_and_trace(cells):
    assert "ebc_.embedding_bags.product_table.weight torch.Size([4096, 80]) torch.uint8" in _stdout(cells, 18)
    assert "ShardedQuantEmbeddingBagCollection(" in _stdout(cells, 19)
    assert "Graph Module Created!" in _stdout(cells, 20) and "Scripted Graph Module Created!" in _stdout(cells, 20)
