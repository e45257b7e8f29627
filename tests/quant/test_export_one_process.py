"""Quantized collections sharded over ranks in one process (rectoolkit.quant.one_process): equal to the unsharded
module, exported as one program (and one per rank) with dynamic batch size and id count, saved, reloaded in a fresh
process, equal to eager exactly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection, QuantEmbeddingCollection
from rectoolkit.quant.export import export_with_jagged_inputs
from rectoolkit.quant.one_process import shard_quant_in_one_process

KEYS = ["a", "b", "c", "d"]
ROWS, DIM = 20, 16
REPO_ROOT = Path(__file__).resolve().parents[2]
on = rtk.ShardMetadata.on_rank


def _plan(column_owners):
    """t_tw on rank 1; t_rw rows 0-9 on rank 0, 10-19 on rank 1; t_cw's two 8-column blocks on `column_owners`."""
    first, second = column_owners
    return {"t_tw": rtk.ParameterSharding("table_wise", ranks=[1], shards=[on(1, 0, 0, ROWS, DIM)]),
            "t_rw": rtk.ParameterSharding("row_wise", ranks=[0, 1], shards=[on(0, 0, 0, 10, DIM), on(1, 10, 0, 10, DIM)]),
            "t_cw": rtk.ParameterSharding("column_wise", ranks=[first, second],
                                          shards=[on(first, 0, 0, ROWS, 8), on(second, 0, 8, ROWS, 8)])}


def _configs(config_class, **mean):
    return [config_class(name="t_tw", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["a"]),
            config_class(name="t_rw", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["b", "d"], **mean),
            config_class(name="t_cw", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["c"])]


def _bags():
    """Weighted, INT8 and INT4 tables, a MEAN table read by two features, sharded over 2 ranks."""
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(_configs(rtk.EmbeddingBagConfig, pooling=rtk.PoolingType.MEAN), is_weighted=True)
    qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=torch.int8, per_table_weight_dtype={"t_cw": torch.quint4x2},
                                                  backend="torch")
    return qebc, shard_quant_in_one_process(qebc, _plan((1, 0)), world_size=2)


def _sequences():
    """INT8 and INT4 tables, need_indices, over 3 ranks (rank 2 holds both column blocks of t_cw)."""
    torch.manual_seed(1)
    ec = rtk.EmbeddingCollection(_configs(rtk.EmbeddingConfig), need_indices=True)
    qec = QuantEmbeddingCollection.from_float(ec, dtype=torch.int8, per_table_weight_dtype={"t_cw": torch.quint4x2},
                                              backend="torch")
    return qec, shard_quant_in_one_process(qec, _plan((2, 2)), world_size=3)


def _flat_batch(batch_size, seed, weighted):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(KEYS) * batch_size,), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    return values, lengths, torch.rand(values.numel(), generator=g) if weighted else None


def _kjt(flat):
    values, lengths, weights = flat
    return rtk.KeyedJaggedTensor.from_lengths_sync(KEYS, values, lengths, weights=weights)


def test_bags_equal_the_unsharded_module():
    qebc, sharded = _bags()
    assert sorted(sharded.ranks) == ["0", "1"]
    for batch_size, seed in [(5, 1), (1, 2)]:
        kjt = _kjt(_flat_batch(batch_size, seed, weighted=True))
        out, expected = sharded(kjt), qebc(kjt)
        assert out.keys() == expected.keys() == ["a", "b", "d", "c"]
        for key in ["a", "c"]:  # one shard per column: the same float sums
            assert torch.equal(out[key], expected[key]), key
        for key in ["b", "d"]:  # partial sums per row block, then added
            torch.testing.assert_close(out[key], expected[key], rtol=1e-6, atol=1e-6)


def test_sequences_equal_the_unsharded_module():
    qec, sharded = _sequences()
    kjt = _kjt(_flat_batch(6, 3, weighted=False))
    out, expected = sharded(kjt), qec(kjt)
    assert list(out) == list(expected) == ["a", "b", "d", "c"]
    for key, jt in expected.items():
        assert torch.equal(out[key].values(), jt.values()), key  # every id reads its stored row
        assert torch.equal(out[key].lengths(), jt.lengths()) and torch.equal(out[key].weights(), jt.weights()), key


def test_sequences_of_a_batch_without_ids_equal_the_unsharded_module():
    qec, sharded = _sequences()
    no_ids = _kjt((torch.zeros(0, dtype=torch.int64), torch.zeros(2 * len(KEYS), dtype=torch.int64), None))
    program = export_with_jagged_inputs(sharded, (_kjt(_flat_batch(4, 0, weighted=False)),))
    expected = qec(no_ids)
    for out in (sharded(no_ids), program.module()(no_ids)):
        assert list(out) == list(expected)
        for key, jt in expected.items():
            assert out[key].values().shape == jt.values().shape == (0, DIM), key
            assert torch.equal(out[key].lengths(), jt.lengths()) and torch.equal(out[key].weights(), jt.weights())


@pytest.mark.timeout(300)
def test_programs_reload_in_a_fresh_process_and_equal_eager(tmp_path):
    """The whole sharded model (bags, sequences), rank 1's program of the bags, the unsharded quantized and float
    EmbeddingCollection; batch sizes and id counts other than the example's (batch 4), among them batch 1 and a
    batch without ids."""
    _, bags = _bags()
    qec, sequences = _sequences()
    float_ec = rtk.EmbeddingCollection(_configs(rtk.EmbeddingConfig), need_indices=True)
    example = {"bags": _flat_batch(4, 0, True), "sequences": _flat_batch(4, 0, False)}
    programs = {"bags": export_with_jagged_inputs(bags, (_kjt(example["bags"]),)),
                "sequences": export_with_jagged_inputs(sequences, (_kjt(example["sequences"]),)),
                "rank1": bags.export_rank(1, _kjt(example["bags"])),
                # the unsharded sequence collections export too (their output split per feature by the lengths)
                "qec": export_with_jagged_inputs(qec, (_kjt(example["sequences"]),)),
                "ec": export_with_jagged_inputs(float_ec, (_kjt(example["sequences"]),))}
    eager = {"sequences": sequences, "qec": qec, "ec": float_ec}
    # the bag program routes ids without reading data (the sequence programs read their output split's sizes)
    targets = {str(node.target) for node in programs["bags"].graph.nodes if node.op == "call_function"}
    assert not targets & {"aten.item.default", "aten._local_scalar_dense.default", "aten.nonzero.default"}, targets
    assert "aten.item.default" in {str(node.target) for node in programs["sequences"].graph.nodes}
    batches = {(7, 11), (1, 12)}
    expected = {}
    for name, program in programs.items():
        torch.export.save(program, tmp_path / f"{name}.pt2")
        for batch_size, seed in batches:
            flat = _flat_batch(batch_size, seed, weighted=name in ("bags", "rank1"))
            torch.save(flat, tmp_path / f"{name}_{batch_size}.in.pt")
            with torch.no_grad():
                if name == "bags":
                    expected[name, batch_size] = [bags(_kjt(flat)).values()]
                elif name == "rank1":
                    expected[name, batch_size] = [bags.ranks["1"](*flat)]
                else:
                    expected[name, batch_size] = [t for jt in eager[name](_kjt(flat)).values()
                                                  for t in (jt.values(), jt.lengths(), jt.weights())]
    no_ids = (torch.zeros(0, dtype=torch.int64), torch.zeros(3 * len(KEYS), dtype=torch.int64), torch.zeros(0))
    torch.save(no_ids, tmp_path / "bags_3.in.pt")
    expected["bags", 3] = [torch.zeros(3, 4 * DIM)]  # empty bags pool to 0 (MEAN too)
    assert torch.equal(bags(_kjt(no_ids)).values(), expected["bags", 3][0])

    script = textwrap.dedent(f"""
        import torch, rectoolkit as rtk
        from rectoolkit.quant.export import register_jagged_pytree_nodes
        register_jagged_pytree_nodes()  # the whole-model programs take and return rectoolkit's jagged types
        root = {str(tmp_path)!r}
        for name, batch_sizes in [("bags", [7, 1, 3]), ("rank1", [7, 1]), ("sequences", [7, 1]), ("qec", [7, 1]),
                                  ("ec", [7, 1])]:
            served = torch.export.load(f"{{root}}/{{name}}.pt2").module()
            for batch_size in batch_sizes:
                values, lengths, weights = torch.load(f"{{root}}/{{name}}_{{batch_size}}.in.pt")
                kjt = rtk.KeyedJaggedTensor.from_lengths_sync({KEYS!r}, values, lengths,
                                                              weights=weights)
                with torch.no_grad():
                    if name == "bags":
                        out = [served(kjt).values()]
                    elif name == "rank1":
                        out = [served(values, lengths, weights)]
                    else:
                        out = [t for jt in served(kjt).values() for t in (jt.values(), jt.lengths(), jt.weights())]
                torch.save(out, f"{{root}}/{{name}}_{{batch_size}}.out.pt")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                            cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    for (name, batch_size), tensors in expected.items():
        served = torch.load(tmp_path / f"{name}_{batch_size}.out.pt")
        assert len(served) == len(tensors), name
        for out, want in zip(served, tensors):
            assert torch.equal(out, want), (name, batch_size, (out.float() - want.float()).abs().max())


def test_refusals_name_the_rank_and_the_module():
    torch.manual_seed(0)
    ec = rtk.EmbeddingCollection(_configs(rtk.EmbeddingConfig))
    qec = QuantEmbeddingCollection.from_float(ec, dtype=torch.int8, backend="torch")
    with pytest.raises(ValueError, match=r"rank 0 holds column shards of widths \[8, 16\]"):
        shard_quant_in_one_process(qec, _plan((1, 0)), world_size=2)
    with pytest.raises(TypeError, match="takes a QuantEmbeddingBagCollection or QuantEmbeddingCollection, got a "
                                        "EmbeddingCollection"):
        shard_quant_in_one_process(ec, _plan((1, 0)), world_size=2)
    _, bags = _bags()
    bad = rtk.KeyedJaggedTensor.from_lengths_sync(KEYS, torch.tensor([3, 20]), torch.tensor([1, 0, 1, 0]),
                                                  weights=torch.ones(2))
    with pytest.raises(ValueError, match="OneProcessShardedQuantEmbeddingBagCollection: .*id 20 of feature 'c'.*"
                                         "table 't_cw' with num_embeddings=20"):
        bags(bad)  # the eager call checks the ids (the program does not: it has no Python to raise)
    with pytest.raises(ValueError, match=r"rank 2 holds no shard of this collection; ranks with shards: \['0', '1'\]"):
        bags.export_rank(2, _kjt(_flat_batch(2, 0, True)))


@pytest.mark.timeout(240)
def test_the_one_process_bags_compile_without_graph_breaks():
    torch._dynamo.reset()
    qebc, sharded = _bags()
    explanation = torch._dynamo.explain(sharded)(_kjt(_flat_batch(4, 0, weighted=True)))
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    compiled = torch.compile(sharded, fullgraph=True, backend="aot_eager")
    for batch_size, seed in [(4, 1), (1, 2)]:
        kjt = _kjt(_flat_batch(batch_size, seed, weighted=True))
        assert torch.equal(compiled(kjt).values(), sharded(kjt).values())
        torch.testing.assert_close(compiled(kjt).values(), qebc(kjt).values(), rtol=1e-6, atol=1e-6)
    torch._dynamo.reset()
