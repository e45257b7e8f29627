"""Export for serving: torch.export of the collections, save, and run in a fresh process without rectoolkit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch.export import Dim

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection
from rectoolkit.quant.export import (
    export_for_serving,
    register_jagged_pytree_nodes,
    save_for_serving,
    serving_inputs,
)

FEATURES = ["a", "b", "c"]


def _ebc(weighted=True):
    tables = [rtk.EmbeddingBagConfig(name="t1", num_embeddings=200, embedding_dim=16, feature_names=["a", "b"]),
              rtk.EmbeddingBagConfig(name="t2", num_embeddings=60, embedding_dim=8, feature_names=["c"],
                                     pooling=rtk.PoolingType.MEAN)]
    return rtk.EmbeddingBagCollection(tables, is_weighted=weighted)


def _kjt(batch, seed, keys=("c", "a", "b"), weighted=True):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * batch,), generator=g)
    values = torch.randint(0, 60, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g)
    return rtk.KeyedJaggedTensor.from_lengths_sync(keys=list(keys), values=values, lengths=lengths,
                                                   weights=weights if weighted else None)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.float16])
def test_exported_program_equals_eager_for_any_batch(dtype):
    qebc = QuantEmbeddingBagCollection.from_float(_ebc(), dtype=dtype, per_table_weight_dtype={"t2": torch.int8},
                                                  backend="torch")
    program = export_for_serving(qebc, _kjt(batch=4, seed=0))
    served = program.module()
    for batch in (1, 3, 17):
        kjt = _kjt(batch, seed=batch)
        out = served(*serving_inputs(kjt, FEATURES, weighted=True))
        torch.testing.assert_close(out, qebc(kjt).values(), rtol=1e-6, atol=1e-6)
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not any("fbgemm" in op for op in ops)  # runs where plain torch runs


@pytest.mark.timeout(120)
def test_float_collection_exports_with_the_same_numbers():
    ebc = _ebc(weighted=False)
    program = export_for_serving(ebc, _kjt(batch=2, seed=1, weighted=False))
    kjt = _kjt(batch=5, seed=2, weighted=False)
    out = program.module()(*serving_inputs(kjt, FEATURES))
    torch.testing.assert_close(out, ebc(kjt).values(), rtol=1e-6, atol=1e-7)


@pytest.mark.timeout(180)
def test_saved_program_runs_in_a_fresh_process_without_rectoolkit(tmp_path):
    qebc = QuantEmbeddingBagCollection.from_float(_ebc(), dtype=torch.int8)
    save_for_serving(export_for_serving(qebc, _kjt(batch=4, seed=0)), tmp_path / "qebc.pt2")
    kjt = _kjt(batch=6, seed=9)
    torch.save(serving_inputs(kjt, FEATURES, weighted=True), tmp_path / "inputs.pt")
    script = textwrap.dedent(f"""
        import sys, torch
        program = torch.export.load({str(tmp_path / "qebc.pt2")!r})
        values, lengths, weights = torch.load({str(tmp_path / "inputs.pt")!r})
        out = program.module()(values, lengths, weights)
        torch.save(out, {str(tmp_path / "out.pt")!r})
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("rectoolkit", "fbgemm_gpu", "torchrec"))
        print("LOADED", loaded)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=150,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LOADED []" in result.stdout
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), qebc(kjt).values(), rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(120)
def test_kjt_in_keyed_tensor_out_exports_with_pytree_nodes():
    register_jagged_pytree_nodes()
    register_jagged_pytree_nodes()  # idempotent
    qebc = QuantEmbeddingBagCollection.from_float(_ebc(weighted=False), dtype=torch.int8, backend="torch")
    example = _kjt(batch=3, seed=4, keys=tuple(FEATURES), weighted=False)
    batch, num_ids = Dim("batch"), Dim("num_ids")
    from torch.fx.experimental import _config as shape_config

    with shape_config.patch(backed_size_oblivious=True):
        program = torch.export.export(qebc, (example,), strict=False,
                                      # the KJT's leaves, TorchRec's: values, weights, lengths, offsets, ...
                                      dynamic_shapes=([{0: num_ids}, None, {0: 3 * batch}, None, None, None],))
    kjt = _kjt(batch=8, seed=5, keys=tuple(FEATURES), weighted=False)
    out = program.module()(kjt)
    assert isinstance(out, rtk.KeyedTensor) and out.keys() == FEATURES
    torch.testing.assert_close(out.values(), qebc(kjt).values())
