"""TrainPipelinePT2 and TorchCompileConfig (rectoolkit.distributed.train_pipeline), and the pipelines' type names
(In, Out, TrainPipelineContext).

A model with an EmbeddingBagCollection, trained through the pipeline with the "eager" and "aot_eager" backends,
gives the losses and weights of the plain loop, bit for bit; "inductor" agrees to rounding (a dense model:
its C++ compile is slow). The steps, the compile step (pre/post_compile_fn), the outputs and the weights equal TorchRec
1.8's own TrainPipelinePT2 on the same model and batches, in training and in eval mode.
"""

from __future__ import annotations

import copy
from typing import List

import pytest
import torch
from torch import nn

from rectoolkit.distributed.train_pipeline import (
    In,
    Out,
    TorchCompileConfig,
    TrainPipelineContext,
    TrainPipelinePT2,
    TrainPipelineSparseDist,
)
from rectoolkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from rectoolkit.sparse import KeyedJaggedTensor
from rectoolkit.train import Batch
from dist_semi_sync_workers import plain_loop

STEPS = 4


class SparseRegression(nn.Module):
    """Pooled embeddings of one feature and the dense features, a linear layer, squared error. Returns (loss, its
    value) (the output of TorchRec's DLRMTrain holds the loss too)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=10,
                                                              feature_names=["f"])])
        self.linear = nn.Linear(4 + 2, 1)

    def forward(self, batch: Batch):
        pooled = self.ebc(batch.sparse_features).values()
        prediction = self.linear(torch.cat([pooled, batch.dense_features], dim=1)).squeeze(1)
        loss = ((prediction - batch.labels) ** 2).mean()
        return loss, loss.detach()


class DenseRegression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, batch: torch.Tensor):
        loss = (self.linear(batch) ** 2).mean()
        return loss, loss.detach()


def sparse_batches(count: int) -> List[Batch]:
    """Batches of 4 samples, 0-2 ids each (so the number of ids changes from batch to batch)."""
    generator = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(count):
        lengths = torch.randint(0, 3, (4,), generator=generator)
        ids = torch.randint(0, 10, (int(lengths.sum()),), generator=generator)
        batches.append(Batch(torch.randn(4, 2, generator=generator),
                             KeyedJaggedTensor.from_lengths_sync(["f"], ids, lengths),
                             torch.randn(4, generator=generator)))
    return batches


def dense_batches(count: int) -> List[torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randn(4, 3, generator=generator) for _ in range(count)]


def plain_losses(model: nn.Module, batches) -> List[torch.Tensor]:
    """The loop TrainPipelinePT2 replaces, eager: the loss of every step."""
    return plain_loop(model, torch.optim.SGD(model.parameters(), lr=0.1), batches)


def through_pipeline(pipeline_class, config_class, model: nn.Module, batches, backend: str, compile_on_iter: int):
    """Every progress() output until StopIteration, and the step (progress() calls before) at which pre_compile_fn
    and post_compile_fn saw the model."""
    outputs, compiled_at = [], []
    pipeline = pipeline_class(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                              config_class(backend=backend, compile_on_iter=compile_on_iter),
                              pre_compile_fn=lambda m: compiled_at.append(("pre", len(outputs), m is model)),
                              post_compile_fn=lambda m: compiled_at.append(("post", len(outputs), m is model)))
    feed = iter(batches)
    while True:
        try:
            output = pipeline.progress(feed)
        except StopIteration:
            return outputs, compiled_at
        outputs.append(output.detach())


def assert_same_weights(model: nn.Module, reference: nn.Module) -> None:
    for (name, weight), (_, expected) in zip(model.state_dict().items(), reference.state_dict().items()):
        assert torch.equal(weight, expected), name


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch, and TorchRec's dynamo settings (it sets them for good) do not leak."""
    import torch._dynamo

    torch._dynamo.reset()
    saved = {name: getattr(torch._dynamo.config, name) for name in (
        "capture_scalar_outputs", "capture_dynamic_output_shape_ops", "skip_torchrec",
        "force_unspec_int_unbacked_size_like_on_torchrec_kjt")}
    yield
    torch._dynamo.reset()
    for name, value in saved.items():
        setattr(torch._dynamo.config, name, value)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_embedding_model_trains_as_in_the_plain_loop(backend):
    batches = sparse_batches(STEPS)
    model, reference = SparseRegression(), SparseRegression()
    outputs, compiled_at = through_pipeline(TrainPipelinePT2, TorchCompileConfig, model, batches, backend,
                                            compile_on_iter=1)
    expected = plain_losses(reference, batches)
    assert len(outputs) == STEPS and all(torch.equal(o, e) for o, e in zip(outputs, expected))
    assert_same_weights(model, reference)
    assert compiled_at == [("pre", 1, True), ("post", 1, True)]
    assert model._compiled_call_impl is not None  # compiled in place, as TorchRec's


def test_inductor_agrees_with_the_plain_loop_to_rounding():
    batches = dense_batches(3)
    model, reference = DenseRegression(), DenseRegression()
    outputs, _ = through_pipeline(TrainPipelinePT2, TorchCompileConfig, model, batches, "inductor", compile_on_iter=1)
    for output, expected in zip(outputs, plain_losses(reference, batches), strict=True):
        torch.testing.assert_close(output, expected)
    torch.testing.assert_close(model.linear.weight, reference.linear.weight)


def test_the_input_transformer_sees_each_batch_on_the_device_before_the_model():
    seen = []

    def transformer(batch):
        seen.append(batch.clone())
        return batch * 2

    model, reference = DenseRegression(), DenseRegression()
    batches = dense_batches(2)
    pipeline = TrainPipelinePT2(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"),
                                TorchCompileConfig(backend="eager", compile_on_iter=5), input_transformer=transformer)
    feed = iter(batches)
    outputs = [pipeline.progress(feed).detach() for _ in batches]
    assert all(torch.equal(s, b) for s, b in zip(seen, batches, strict=True))
    assert all(torch.equal(o, e) for o, e in zip(outputs, plain_losses(reference, [b * 2 for b in batches])))
    assert model._compiled_call_impl is None  # step 5 never came


@pytest.mark.torchrec
@pytest.mark.parametrize("training", [True, False])
def test_steps_compile_step_outputs_and_weights_equal_torchrecs(training):
    pytest.importorskip("torchrec")
    from torchrec.distributed.train_pipeline import TorchCompileConfig as TheirConfig
    from torchrec.distributed.train_pipeline import TrainPipelinePT2 as TheirPT2

    batches = dense_batches(STEPS)
    ours, theirs = DenseRegression(), DenseRegression()
    ours.train(training)
    theirs.train(training)
    our_outputs, our_compile = through_pipeline(TrainPipelinePT2, TorchCompileConfig, ours, batches, "aot_eager", 2)
    torch._dynamo.reset()
    their_outputs, their_compile = through_pipeline(TheirPT2, TheirConfig, theirs, batches, "aot_eager", 2)
    assert our_compile == their_compile == [("pre", 2, True), ("post", 2, True)]
    assert len(our_outputs) == len(their_outputs) == STEPS
    assert all(torch.equal(o, t) for o, t in zip(our_outputs, their_outputs))
    assert_same_weights(ours, theirs)
    assert training or torch.equal(ours.linear.weight, DenseRegression().linear.weight)  # eval: no step
    assert TorchCompileConfig() == TorchCompileConfig(**vars(TheirConfig()))  # the same defaults


def test_bad_configs_are_refused_when_built():
    with pytest.raises(TypeError, match="backend"):
        TorchCompileConfig(backend=3)
    with pytest.raises(TypeError, match="compile_on_iter"):
        TorchCompileConfig(compile_on_iter="3")
    with pytest.raises(TypeError, match="dynamic"):
        TorchCompileConfig(dynamic="yes")
    model = DenseRegression()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(Exception, match="Invalid backend: 'inductr'"):
        TrainPipelinePT2(model, optimizer, torch.device("cpu"), TorchCompileConfig(backend="inductr"))
    with pytest.raises(TypeError, match="TorchCompileConfig"):
        TrainPipelinePT2(model, optimizer, torch.device("cpu"), {"backend": "eager"})
    copy.deepcopy(TorchCompileConfig())  # a plain dataclass (TorchRec's is mutable too)


def test_the_type_names_work_as_torchrecs():
    """TorchRec code annotates with TrainPipelineSparseDist[Batch, Out] and passes context_type=TrainPipelineContext
    (the default): both work; another context class is refused, naming it."""
    assert TrainPipelineSparseDist[Batch, torch.Tensor].__origin__ is TrainPipelineSparseDist
    assert TrainPipelinePT2[In, Out].__origin__ is TrainPipelinePT2
    with pytest.raises(ValueError, match="not a DistributedModelParallel"):  # got past context_type
        TrainPipelineSparseDist(nn.Linear(1, 1), None, torch.device("cpu"), context_type=TrainPipelineContext)

    class MyContext(TrainPipelineContext):
        pass

    with pytest.raises(NotImplementedError, match="context_type=MyContext"):
        TrainPipelineSparseDist(nn.Linear(1, 1), None, torch.device("cpu"), context_type=MyContext)
