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
