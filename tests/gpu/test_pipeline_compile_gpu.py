"""Issue 17's paths on the GPU: TrainPipelineSparseDist with CUDA batches (the copy of the next batch on a side
stream, the next batch's ids sent while this one trains), equal to the plain loop bit for bit, on NCCL at world
size 1 and on 2 ranks sharing the GPU over gloo; torch.compile(fullgraph=True, backend="inductor") of a DLRM on
CUDA (Triton kernels): no graph break, outputs and gradients equal eager."""

from __future__ import annotations

import copy

import pytest
import torch

import rectoolkit as rtk
from gpu_helpers import dry_run
from dist_harness import run_workers
from gpu_workers import pipeline_device_worker
from rectoolkit.train.model import DLRM

pytestmark = pytest.mark.gpu

NCCL = "gloo" if dry_run() else "nccl"
ONE_GPU = "cpu" if dry_run() else "cuda:0"
STEPS = 5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world_size, backend", [(1, NCCL), (2, "gloo")], ids=["1-rank-nccl", "2-ranks-gloo"])
def test_train_pipeline_on_the_gpu_equals_the_plain_loop(world_size, backend):
    run_workers(pipeline_device_worker, world_size, ONE_GPU, ["table_wise", "mixed_a", "sequence_row_wise"], STEPS,
                backend=backend)


def _dlrm_and_batches(device):
    torch.manual_seed(0)
    tables = [rtk.EmbeddingBagConfig(name="t0", num_embeddings=50, embedding_dim=8, feature_names=["f0", "f1"]),
              rtk.EmbeddingBagConfig(name="t1", num_embeddings=30, embedding_dim=8, feature_names=["f2"],
                                     pooling=rtk.PoolingType.MEAN)]
    model = DLRM(rtk.EmbeddingBagCollection(tables), dense_in_features=3, dense_arch_layer_sizes=[16, 8],
                 over_arch_layer_sizes=[16, 1]).to(device)
    g = torch.Generator().manual_seed(3)
    out = []
    for batch_size in (5, 9):  # a second batch size and id count: dynamic shapes, one recompile at most
        lengths = torch.randint(0, 5, (3 * batch_size,), generator=g)
        values = torch.randint(0, 30, (int(lengths.sum()),), generator=g)
        kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1", "f2"], values, lengths)
        out.append((torch.randn(batch_size, 3, generator=g).to(device), kjt.to(device)))
    return model, out


@pytest.mark.timeout(420)
def test_dlrm_fullgraph_inductor_on_the_gpu_equals_eager(device):
    torch._dynamo.reset()
    model, batches = _dlrm_and_batches(device)
    reference = copy.deepcopy(model)
    explanation = torch._dynamo.explain(model)(*batches[0])
    assert explanation.graph_break_count == 0, [(b.reason, b.user_stack[-2:]) for b in explanation.break_reasons]
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    for dense, kjt in batches:
        out, expected = compiled(dense, kjt), reference(dense, kjt)
        assert out.device == device
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        out.square().sum().backward()
        expected.square().sum().backward()
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
    torch._dynamo.reset()
