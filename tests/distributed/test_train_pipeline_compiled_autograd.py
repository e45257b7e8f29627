"""TrainPipelineSparseDistCompAutograd (rectoolkit.distributed.train_pipeline.compiled_autograd): the steps of
TrainPipelineSparseDist with every backward compiled by compiled autograd. With the "eager" backend the losses and
weights are the plain loop's to rounding (the compiled backward may sum a gradient's parts in another order: 3e-8
apart on one table after 4 steps; one process here, two ranks in test_train_pipeline_fused's 2-rank run); a
counting backend shows the backward graphs really went through torch.compile."""

from __future__ import annotations

import inspect

import pytest
import torch

from rectoolkit.distributed.train_pipeline import TrainPipelineSparseDistCompAutograd
from dist_pipeline_workers import assert_close_to, batches, build, check_pipelined, local_env, path_of, pipelined, \
    plain_loop

STEPS = 4


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    saved = torch._dynamo.config.optimize_ddp
    yield
    torch._dynamo.reset()
    torch._dynamo.config.optimize_ddp = saved


class CountingBackend:
    """A torch.compile backend that runs the graph as traced and counts the graphs it was given."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


def test_every_backward_is_compiled_and_the_numbers_are_the_plain_loops_to_rounding():
    case = "sequence_table_wise"  # an EmbeddingCollection here; the 2-rank run has an EmbeddingBagCollection's mixed plan
    data = batches(0, 1, STEPS, case)
    backend = CountingBackend()
    losses, state, info = pipelined(case, data, 1, local_env(), pipeline_class="TrainPipelineSparseDistCompAutograd",
                                    compiled_autograd_options={"backend": backend, "fullgraph": False})
    check_pipelined(0, case, info, path_of(case))
    assert_close_to(0, case, plain_loop(case, data, 1, local_env()), (losses, state), STEPS)
    assert backend.graphs > 0  # the backward graphs went through torch.compile


def test_the_options_come_from_the_argument_else_the_model_else_the_default():
    dmp, optimizer = build("row_wise", 1, local_env())
    default = TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"))
    assert default.compiled_autograd_options == {"backend": "inductor", "dynamic": True, "fullgraph": False}
    dmp._compiled_autograd_options = {"backend": "eager"}  # TorchRec's way: an attribute of the model
    assert TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu")).compiled_autograd_options == {
        "backend": "eager"}
    given = TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"),
                                                compiled_autograd_options={"backend": "aot_eager"})
    assert given.compiled_autograd_options == {"backend": "aot_eager"}
    # the first call (the first forward) runs plain, every later one under compiled autograd, as TorchRec's
    assert not given.initialized
    with given.get_compiled_autograd_ctx():
        assert not torch._dynamo.compiled_autograd.in_compiled_autograd_region
    assert given.initialized


def test_bad_options_are_refused_with_the_fix():
    dmp, optimizer = build("row_wise", 1, local_env())
    with pytest.raises(NotImplementedError, match="fullgraph=True.*give fullgraph=False"):
        TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"),
                                            compiled_autograd_options={"backend": "eager", "fullgraph": True})
    with pytest.raises(TypeError, match=r"\['fullgrph'\] are not torch.compile keyword arguments"):
        TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"), compiled_autograd_options={"fullgrph": 1})
    with pytest.raises(TypeError, match="must be a dict"):
        TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"), compiled_autograd_options="eager")
    with pytest.raises(Exception, match="inductr"):
        TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"),
                                            compiled_autograd_options={"backend": "inductr"})
    with pytest.raises(NotImplementedError, match="apply_jit"):
        TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"), apply_jit=True)


@pytest.mark.torchrec
def test_torchrecs_arguments_are_accepted_by_name():
    pytest.importorskip("torchrec")
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDistCompAutograd as Theirs

    theirs = list(inspect.signature(Theirs.__init__).parameters)
    ours = list(inspect.signature(TrainPipelineSparseDistCompAutograd.__init__).parameters)
    assert ours[:len(theirs)] == theirs
