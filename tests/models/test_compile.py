"""torch.compile(fullgraph=True) of a DLRM with an EmbeddingBagCollection, of the EBC alone and of a KJT built
inside the compiled function: no graph break, and the same outputs and gradients as eager (the eager run uses
the kernel's own autograd function, a different code path from the traced lookup).

Most tests use the aot_eager backend (dynamo + AOTAutograd, no code generation: seconds); one runs inductor.
"""

from __future__ import annotations

import copy

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.train.model import DLRM

FEATURES = ["f0", "f1", "f2"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _dlrm(seed=0):
    torch.manual_seed(seed)
    tables = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"]),
              rtk.EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=4, feature_names=["f2"],
                                     pooling=rtk.PoolingType.MEAN)]
    ebc = rtk.EmbeddingBagCollection(tables)
    return DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1])


def _batch(batch_size, seed, weighted=False, keys=FEATURES):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * batch_size,), generator=g)
    values = torch.randint(0, 7, (int(lengths.sum()),), generator=g)
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(list(keys), values, lengths, weights=weights)
    return torch.randn(batch_size, 3, generator=g), kjt


def _assert_same_grads(model, reference):
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.grad is not None and q.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def _assert_same_step(compiled, model, reference, inputs, rtol):
    """Forward: the same logits; backward of a loss: the same gradients on every parameter."""
    out = compiled(*inputs)
    expected = reference(*inputs)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=1e-6)
    out.square().sum().backward()
    expected.square().sum().backward()
    _assert_same_grads(model, reference)


def _assert_same_steps(compiled, model, reference, batches, rtol=1e-6):
    """_assert_same_step for each batch's inputs, gradients cleared between."""
    for inputs in batches:
        _assert_same_step(compiled, model, reference, inputs, rtol)
        model.zero_grad()
        reference.zero_grad()


def test_dlrm_forward_has_no_graph_break():
    model = _dlrm()
    explanation = torch._dynamo.explain(model)(*_batch(4, seed=1))
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.timeout(240)
def test_dlrm_fullgraph_forward_backward_equals_eager_for_changing_batches():
    model = _dlrm()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    # batch sizes and id counts change
    _assert_same_steps(compiled, model, reference, [_batch(b, seed) for b, seed in [(4, 1), (6, 2), (1, 3), (9, 4)]])


@pytest.mark.timeout(420)
def test_dlrm_fullgraph_inductor_forward_backward_equals_eager():
    model = _dlrm()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    _assert_same_step(compiled, model, reference, _batch(5, seed=7), rtol=1e-5)


@pytest.mark.timeout(240)
def test_weighted_ebc_of_mixed_dims_and_a_kjt_built_inside_compile():
    torch.manual_seed(0)
    tables = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"]),
              rtk.EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=6, feature_names=["f2"])]
    ebc = rtk.EmbeddingBagCollection(tables, is_weighted=True)
    reference = copy.deepcopy(ebc)

    def pooled(values, lengths, weights):  # the KJT is built (and permuted) inside the compiled function
        kjt = rtk.KeyedJaggedTensor(keys=["f2", "f0", "f1"], values=values, lengths=lengths, weights=weights)
        return kjt, ebc(kjt).values()

    compiled = torch.compile(pooled, fullgraph=True, backend="aot_eager")
    explanation = torch._dynamo.explain(pooled)(*_flat(_batch(3, seed=5, weighted=True)[1]))
    assert explanation.graph_break_count == 0, [(b.reason, b.user_stack[-2:]) for b in explanation.break_reasons]
    for batch_size, seed in [(3, 5), (7, 6)]:
        _, kjt = _batch(batch_size, seed, weighted=True, keys=["f2", "f0", "f1"])
        weights = kjt.weights().clone().requires_grad_(True)
        values, lengths, _ = _flat(kjt)
        rebuilt, out = compiled(values, lengths, weights)
        assert rebuilt.keys() == ["f2", "f0", "f1"] and torch.equal(rebuilt.lengths(), lengths)
        reference_weights = kjt.weights().clone().requires_grad_(True)
        expected = reference(rtk.KeyedJaggedTensor(keys=["f2", "f0", "f1"], values=values, lengths=lengths,
                                                   weights=reference_weights)).values()
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(weights.grad, reference_weights.grad, rtol=1e-5, atol=1e-6)
        _assert_same_grads(ebc, reference)
        ebc.zero_grad()
        reference.zero_grad()


def _flat(kjt):
    return kjt.values(), kjt.lengths(), kjt.weights()


def test_eager_calls_keep_their_checks_after_compiling():
    model = _dlrm()
    torch.compile(model, fullgraph=True, backend="aot_eager")(*_batch(2, seed=1))
    dense, _ = _batch(2, seed=1)
    bad = rtk.KeyedJaggedTensor.from_lengths_sync(FEATURES, torch.tensor([3, 10]), torch.tensor([1, 0, 0, 1, 0, 0]))
    with pytest.raises(ValueError, match="id 10 of feature 'f1'.*table 't0' with num_embeddings=10"):
        model(dense, bad)
    with pytest.raises(ValueError, match="lengths sum to 3 but values has only 2 entries"):
        rtk.KeyedJaggedTensor.from_lengths_sync(FEATURES, torch.tensor([3, 1]), torch.tensor([1, 1, 0, 1, 0, 0]))


def test_fused_optimizer_lookup_runs_outside_the_graph_and_says_why():
    torch.manual_seed(0)
    tables = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=FEATURES)]
    ebc = rtk.EmbeddingBagCollection(tables, optimizer="sgd", lr=0.5)
    before = ebc.embedding_bags["t0"].weight.detach().clone()
    _, kjt = _batch(3, seed=2)
    explanation = torch._dynamo.explain(ebc)(kjt)
    assert any("a fused optimizer updates the tables" in b.reason for b in explanation.break_reasons)
    with pytest.raises(Exception, match="build the collection with optimizer=None"):
        torch.compile(ebc, fullgraph=True, backend="aot_eager")(kjt)
    torch._dynamo.reset()
    torch.compile(ebc, backend="aot_eager")(kjt).values().sum().backward()  # without fullgraph: runs, updates
    # d(sum)/d(row) is 1 per column for every occurrence of the id: SGD subtracts lr * count
    counts = torch.bincount(kjt.values(), minlength=10).to(torch.float32)[:, None]
    torch.testing.assert_close(ebc.embedding_bags["t0"].weight.detach(), before - 0.5 * counts)


@pytest.mark.timeout(240)
def test_a_collection_moved_after_construction_compiles_on_its_new_device():
    # built on meta then materialized: the kernel must follow the weights at once (a traced forward cannot
    # rebuild it), as it must after `.to("cuda")` (tests/gpu/test_pipeline_compile_gpu.py)
    tables = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"]),
              rtk.EmbeddingBagConfig(name="t1", num_embeddings=7, embedding_dim=4, feature_names=["f2"])]
    ebc = rtk.EmbeddingBagCollection(tables, device=torch.device("meta"))
    ebc.to_empty(device="cpu")
    ebc.reset_parameters()
    assert ebc.kernel.device == torch.device("cpu") and ebc.device == torch.device("cpu")
    _, kjt = _batch(4, seed=2)
    compiled = torch.compile(ebc, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(kjt).values(), ebc(kjt).values(), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------- EmbeddingCollection
# Its output is split per feature by the lengths: sizes read from the data. Dynamo traces that read (.tolist())
# with capture_scalar_outputs=True, as TorchRec's compiled models need too; the sizes become symbols of the graph.
SEQUENCE_KEYS = ["f2", "f0", "f1"]  # not the collection's order: the traced gather permutes the features


def _ec(seed=0, need_indices=False):
    torch.manual_seed(seed)
    tables = [rtk.EmbeddingConfig(name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "f1"]),
              rtk.EmbeddingConfig(name="t1", num_embeddings=7, embedding_dim=4, feature_names=["f2"])]
    return rtk.EmbeddingCollection(tables, need_indices=need_indices)


class _SequenceModel(torch.nn.Module):
    """An EmbeddingCollection, a per-id projection, each sample's rows summed (per feature), then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.ec = _ec(seed=3)
        self.project = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(12, 1)

    def forward(self, kjt):
        pooled = []
        for jt in self.ec(kjt).values():
            lengths = jt.lengths()
            sample = torch.arange(lengths.shape[0]).repeat_interleave(lengths, output_size=jt.values().shape[0])
            rows = torch.relu(self.project(jt.values()))
            pooled.append(torch.zeros(lengths.shape[0], 4).index_add(0, sample, rows))
        return self.head(torch.cat(pooled, dim=1))


@pytest.mark.timeout(240)
def test_embedding_collection_compiles_without_graph_breaks_and_equals_eager():
    ec = _ec(need_indices=True)
    reference = copy.deepcopy(ec)

    def rows(kjt):
        out = ec(kjt)
        return [out[name].values() for name in ["f0", "f1", "f2"]], [out[name].weights() for name in ["f0", "f1", "f2"]]

    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        explanation = torch._dynamo.explain(rows)(_batch(3, seed=5, keys=SEQUENCE_KEYS)[1])
        assert explanation.graph_break_count == 0, [(b.reason, b.user_stack[-2:]) for b in explanation.break_reasons]
        compiled = torch.compile(rows, fullgraph=True, backend="aot_eager")
        for batch_size, seed in [(3, 5), (7, 6), (1, 7)]:
            kjt = _batch(batch_size, seed, keys=SEQUENCE_KEYS)[1]
            values, indices = compiled(kjt)
            expected = reference(kjt)
            for name, got, ids in zip(["f0", "f1", "f2"], values, indices):
                assert torch.equal(got, expected[name].values()), name  # rows read, not summed: exact
                assert torch.equal(ids, kjt[name].values()), name
            # each id's row gets the gradient of its own output row: weight the rows to tell them apart
            loss = sum((v * (i + 1)).square().sum() for i, v in enumerate(values))
            loss.backward()
            sum((expected[n].values() * (i + 1)).square().sum() for i, n in enumerate(["f0", "f1", "f2"])).backward()
            _assert_same_grads(ec, reference)
            ec.zero_grad()
            reference.zero_grad()


@pytest.mark.timeout(240)
def test_a_model_over_an_embedding_collection_compiles_fullgraph_with_equal_gradients():
    model = _SequenceModel()
    reference = copy.deepcopy(model)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        explanation = torch._dynamo.explain(model)(_batch(4, seed=1, keys=SEQUENCE_KEYS)[1])
        assert explanation.graph_break_count == 0, [(b.reason, b.user_stack[-2:]) for b in explanation.break_reasons]
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        _assert_same_steps(compiled, model, reference,
                           [_batch(b, seed, keys=SEQUENCE_KEYS)[1:] for b, seed in [(4, 1), (6, 2), (1, 3)]])


@pytest.mark.timeout(240)
def test_dynamic_compile_makes_one_graph_for_batches_of_several_sizes():
    """dynamic=True: one graph serves every batch size above 1 and every id count (no recompile on the second call:
    the traced lookup keeps nothing on the collection while tracing, which dynamo would guard on)."""
    from torch._dynamo.utils import counters

    model = _dlrm()  # two tables: the lookup's masked pass per table
    reference = copy.deepcopy(model)
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    _assert_same_steps(compiled, model, reference, [_batch(b, seed) for b, seed in [(4, 1), (6, 2), (9, 3), (2, 4)]])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


@pytest.mark.timeout(240)
def test_a_batch_of_one_recompiles_only_by_torchs_0_1_specialization():
    """dynamic=True recompiles for a batch of 1 after larger ones (TORCH_LOGS=recompiles: the guard `2 <= size` is
    PyTorch's 0/1 specialization, not a branch in rectoolkit: a plain nn.Linear recompiles the same way). Without
    that specialization (backed_size_oblivious) the model is one graph for every batch size, 1 included."""
    from torch._dynamo.utils import counters
    from torch.fx.experimental import _config as shape_config

    linear = torch.nn.Linear(3, 2)
    counters.clear()
    compiled_linear = torch.compile(linear, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch_size in (4, 6, 1):
        compiled_linear(torch.randn(batch_size, 3))
    assert counters["stats"]["unique_graphs"] == 2  # the framework's own recompile, on any model

    torch._dynamo.reset()
    model = _dlrm()
    counters.clear()
    with shape_config.patch(backed_size_oblivious=True), torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
        for batch_size, seed in [(4, 1), (6, 2), (1, 3), (2, 4)]:
            batch = _batch(batch_size, seed)
            torch.testing.assert_close(compiled(*batch), model(*batch))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
