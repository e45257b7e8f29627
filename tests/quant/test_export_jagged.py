"""torch.export of float and quantized collections, and of a DLRM, taking KeyedJaggedTensors as they are:
dynamic batch size and id count, saved, reloaded in a fresh process, equal to eager (float to 1e-6, quantized
exactly)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection
from rectoolkit.quant.export import export_with_jagged_inputs
from rectoolkit.train.model import DLRM

KEYS = ["f0", "f1", "f2"]
REPO_ROOT = Path(__file__).resolve().parents[2]


def _tables(dim_f2=6):
    return [rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"]),
            rtk.EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=dim_f2, feature_names=["f2"],
                                   pooling=rtk.PoolingType.MEAN)]


def _flat_batch(batch_size, seed, weighted):
    """(dense [B, 3], values, lengths, weights or None): the tensors a KJT is rebuilt from in either process."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(KEYS) * batch_size,), generator=g)
    values = torch.randint(0, 7, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return torch.randn(batch_size, 3, generator=g), values, lengths, weights


def _args(flat, with_dense):
    dense, values, lengths, weights = flat
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(KEYS, values, lengths, weights=weights)
    return (dense, kjt) if with_dense else (kjt,)


def _models():
    """name -> (module, weighted input, takes dense features, output to tensor, exact comparison)."""
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(_tables(), is_weighted=True)
    qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, per_table_weight_dtype={"t1": torch.quint4x2},
                                                  backend="torch")
    dlrm = DLRM(rtk.EmbeddingBagCollection(_tables(dim_f2=4)), dense_in_features=3, dense_arch_layer_sizes=[8, 4],
                over_arch_layer_sizes=[8, 1])
    return {"ebc": (ebc, True, False, False), "qebc": (qebc, True, False, True), "dlrm": (dlrm, False, True, False)}


def _as_tensor(out):
    return out if isinstance(out, torch.Tensor) else out.values()


def _assert_equal(out, expected, exact):
    if exact:
        assert torch.equal(out, expected), (out - expected).abs().max()
    else:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(300)
def test_programs_reload_in_a_fresh_process_and_equal_eager(tmp_path):
    batches = [(1, 11), (7, 12)]  # the example below has batch 3: other batch sizes and id counts
    expected = {}
    for name, (module, weighted, with_dense, exact) in _models().items():
        module.eval()
        program = export_with_jagged_inputs(module, _args(_flat_batch(3, 0, weighted), with_dense))
        torch.export.save(program, tmp_path / f"{name}.pt2")
        for batch_size, seed in batches:
            flat = _flat_batch(batch_size, seed, weighted)
            torch.save(flat, tmp_path / f"{name}_{batch_size}.in.pt")
            with torch.no_grad():
                expected[name, batch_size] = (_as_tensor(module(*_args(flat, with_dense))), exact)
            _assert_equal(_as_tensor(program.module()(*_args(flat, with_dense))), *expected[name, batch_size])

    script = textwrap.dedent(f"""
        import torch, rectoolkit as rtk
        from rectoolkit.quant.export import register_jagged_pytree_nodes
        register_jagged_pytree_nodes()  # the programs take and return rectoolkit's jagged types
        for name, with_dense in {[(n, m[2]) for n, m in _models().items()]!r}:
            served = torch.export.load({str(tmp_path)!r} + f"/{{name}}.pt2").module()
            for batch_size in {[b for b, _ in batches]!r}:
                dense, values, lengths, weights = torch.load({str(tmp_path)!r} + f"/{{name}}_{{batch_size}}.in.pt")
                kjt = rtk.KeyedJaggedTensor.from_lengths_sync({KEYS!r}, values, lengths, weights=weights)
                with torch.no_grad():
                    out = served(dense, kjt) if with_dense else served(kjt).values()
                torch.save(out, {str(tmp_path)!r} + f"/{{name}}_{{batch_size}}.out.pt")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    for (name, batch_size), (out, exact) in expected.items():
        _assert_equal(torch.load(tmp_path / f"{name}_{batch_size}.out.pt"), out, exact)


def test_a_variable_batch_kjt_is_refused_with_the_argument_named():
    ebc = rtk.EmbeddingBagCollection(_tables())
    kjt = rtk.KeyedJaggedTensor(keys=KEYS, values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 0, 1]),
                                stride_per_key_per_rank=[[1], [2], [1]])
    with pytest.raises(NotImplementedError, match="argument 0: a KeyedJaggedTensor with a batch size per feature"):
        export_with_jagged_inputs(ebc, (kjt,))


def test_a_collection_exports_again_and_compiles_after_an_export():
    """Nothing the trace makes stays on the module: a second torch.export (static shapes too, as TorchRec code
    writes it) and a torch.compile of the same collection work and equal eager."""
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(_tables())  # two tables: the traced lookup's masked pass per table
    kjt = _args(_flat_batch(3, 0, weighted=False), with_dense=False)[0]
    programs = [export_with_jagged_inputs(ebc, (kjt,)), torch.export.export(ebc, (kjt,), strict=False),
                export_with_jagged_inputs(ebc, (kjt,))]
    for program in programs:
        torch.testing.assert_close(program.module()(kjt).values(), ebc(kjt).values(), rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()
    compiled = torch.compile(ebc, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(kjt).values(), ebc(kjt).values(), rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.timeout(300)
def test_a_quantized_program_loads_where_only_torch_and_rectoolkit_are_imported(tmp_path):
    """A quantized collection on fbgemm's lookup (the default where fbgemm_gpu loads) exports the aten lookup: the
    program loads in a process that never imports fbgemm_gpu, with eager's numbers."""
    from rectoolkit.kernels.backend import fbgemm_available

    torch.manual_seed(0)
    qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(_tables()), dtype=torch.int8)
    if not fbgemm_available():
        pytest.skip("fbgemm_gpu is not available: the quantized lookup is the aten one anyway")
    assert qebc._lookup.backend == "fbgemm"
    program = export_with_jagged_inputs(qebc, _args(_flat_batch(3, 0, weighted=False), with_dense=False))
    assert not [n.target for n in program.graph.nodes if "fbgemm" in str(n.target)]
    torch.export.save(program, tmp_path / "qebc.pt2")
    flat = _flat_batch(6, 1, weighted=False)
    torch.save(flat, tmp_path / "in.pt")
    script = textwrap.dedent(f"""
        import sys, torch, rectoolkit as rtk
        served = torch.export.load({str(tmp_path / "qebc.pt2")!r}).module()
        dense, values, lengths, weights = torch.load({str(tmp_path / "in.pt")!r})
        out = served(rtk.KeyedJaggedTensor.from_lengths_sync({KEYS!r}, values, lengths)).values()
        torch.save(out, {str(tmp_path / "out.pt")!r})
        assert "fbgemm_gpu" not in sys.modules, "the check needs a process without fbgemm_gpu"
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    expected = qebc(_args(flat, with_dense=False)[0]).values()
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, rtol=1e-6, atol=1e-6)
