"""Workers of the train pipeline tests: the same N steps through the plain loop and through
TrainPipelineSparseDist, on two DMPs built alike (importable by spawned processes)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from rectoolkit.distributed import (
    DistributedModelParallel, EvalPipelineSparseDist, ShardingEnv, TrainPipelineSparseDist, full_state_dict)
from rectoolkit.distributed.train_pipeline import train_pipelines
from rectoolkit.optim import CombinedOptimizer
from rectoolkit.plan.types import ShardingPlan, ShardingType
from rectoolkit.train.data import Batch
import rectoolkit as rtk
from dist_dmp_workers import TinyModel, step_batches
from dist_harness import make_batch, run_cpu_shims
from dist_workers import BATCH, bag_tables, plan_for, seq_tables

PATH = "model.sparse.ebc"  # the collection inside WithLoss
SEQUENCE_PATH = "ec"  # the collection inside SequenceWithLoss; cases "sequence_<plan>" use it


class WithLoss(nn.Module):
    """TorchRec's model contract for pipelines: forward(batch) -> (loss, output)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TinyModel()

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, loss.detach()


class SequenceWithLoss(nn.Module):
    """An EmbeddingCollection (one row per id) and a dense layer; forward(batch) -> (loss, loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.ec = rtk.EmbeddingCollection(seq_tables(), optimizer="adagrad", lr=0.1)
        self.dense = nn.Linear(3, 8)

    def forward(self, batch: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = torch.cat([jt.values() for jt in self.ec(batch.sparse_features).values()])
        loss = (rows.sum(1) - 1).square().mean() + self.dense(batch.dense_features).square().mean()
        return loss, loss.detach()


def sequence_case(case: str) -> bool:
    return case.startswith("sequence_")


def batches(rank: int, W: int, steps: int, case: str = "") -> List[Batch]:
    """This rank's batches, the same for both runs (fixed seeds)."""
    out = []
    for step in range(steps):
        kjts, dense = step_batches(step, W)
        if sequence_case(case):
            features = {f: t.num_embeddings for t in seq_tables() for f in t.feature_names}
            kjts = [make_batch(features, BATCH, seed=500 + 1000 * step + r) for r in range(W)]
        labels = (torch.rand(dense[rank].shape[0], generator=torch.Generator().manual_seed(5 + step)) > 0.5).float()
        out.append(Batch(dense[rank], kjts[rank], labels))
    return out


def path_of(case: str) -> str:
    return SEQUENCE_PATH if sequence_case(case) else PATH


def build(case: str, W: int, env=None):
    """The DMP (same initial weights on every call) and its optimizer: fused Adagrad in backward, Adam dense."""
    torch.manual_seed(0)
    if sequence_case(case):
        plan = ShardingPlan({SEQUENCE_PATH: plan_for(case.removeprefix("sequence_"), seq_tables(), W, 1)})
        dmp = DistributedModelParallel(SequenceWithLoss(), env=env, plan=plan)
    else:
        dmp = DistributedModelParallel(WithLoss(), env=env, plan=ShardingPlan({PATH: plan_for(case, bag_tables(), W, 1)}))
    optimizer = CombinedOptimizer([("fused", dmp.fused_optimizer),
                                   ("dense", torch.optim.Adam(dmp.dense_parameters(), lr=0.01))])
    return dmp, optimizer


def plain_loop(case: str, data: List[Batch], W: int, env=None, device: str = "cpu"):
    """The loop the pipeline must reproduce: zero_grad, forward, backward, step, batch after batch."""
    dmp, optimizer = build(case, W, env)
    losses = []
    for batch in data:
        optimizer.zero_grad()
        loss, _ = dmp(batch.to(torch.device(device)))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, full_state_dict(dmp)


def count_own_input_dists(dmp, case: str) -> Tuple[List[int], list]:
    """Count the input_dists the forward runs itself, on the groups that send ids: (a list that grows by one per
    call, those groups)."""
    sync_calls: List[int] = []
    routed = [g for g in dmp.sharded_modules[path_of(case)].groups.values()
              if g.sharding_type != ShardingType.DATA_PARALLEL]
    for group in routed:
        group.input_dist = lambda batch, original=group.input_dist: sync_calls.append(1) or original(batch)
    return sync_calls, routed


def pipelined(case: str, data: List[Batch], W: int, env=None, execute_all_batches: bool = True,
              device: str = "cpu", pipeline_class: str = "TrainPipelineSparseDist", **pipeline_kwargs):
    """The same through TrainPipelineSparseDist (or another pipeline of train_pipelines, by name); also what it
    pipelined, how long it waited and how often a forward ran its own input_dist (`sync_input_dists`, counted on
    the groups that send ids)."""
    dmp, optimizer = build(case, W, env)
    sync_calls, routed = count_own_input_dists(dmp, case)
    pipeline = getattr(train_pipelines, pipeline_class)(dmp, optimizer, torch.device(device),
                                                        execute_all_batches=execute_all_batches, **pipeline_kwargs)
    losses, stops = [], 0
    feed = iter(data)
    while True:
        try:
            losses.append(pipeline.progress(feed))
        except StopIteration:
            stops += 1
            break
    try:
        pipeline.progress(feed)
    except StopIteration:
        stops += 1
    info = dict(modules=pipeline.pipelined_modules, waits=dict(dmp.env.stats.wait_s), stops=stops,
                sync_input_dists=len(sync_calls), routed_groups=len(routed),
                side_stream=pipeline._memcpy_stream is not None)
    return losses, full_state_dict(dmp), info


def check_pipelined(rank: int, case: str, info: Dict, path: str = "") -> None:
    """The collection (at `path`, default: the case's) was pipelined: only the first step's forward sent its own
    ids; StopIteration at the end and again after; the waits are counted."""
    assert info["modules"] == [path or path_of(case)], f"rank {rank} {case}: pipelined {info['modules']}"
    assert info["sync_input_dists"] == info["routed_groups"], (
        f"rank {rank} {case}: forward ran its own input_dist {info['sync_input_dists']} times; only the first "
        f"step's {info['routed_groups']} groups should")
    assert info["stops"] == 2, f"rank {rank} {case}: StopIteration raised {info['stops']} times, expected 2"
    assert "input_dist" in info["waits"] and "metadata" in info["waits"], f"rank {rank} {case}: {info['waits']}"


def assert_identical(rank: int, case: str, plain: Tuple[list, Dict], piped: Tuple[list, Dict], steps: int) -> None:
    (plain_losses, plain_state), (piped_losses, piped_state) = plain, piped
    assert len(piped_losses) == steps, f"rank {rank} {case}: the pipeline trained {len(piped_losses)} of {steps} batches"
    for step, (a, b) in enumerate(zip(plain_losses, piped_losses)):
        assert torch.equal(a, b), f"rank {rank} {case} step {step}: loss {a.item()!r} (plain) != {b.item()!r} (pipeline)"
    assert list(plain_state) == list(piped_state)
    for key, value in plain_state.items():
        assert torch.equal(value, piped_state[key]), (
            f"rank {rank} {case}: {key} differs by {(value - piped_state[key]).abs().max()} after {steps} steps")


def assert_close_to(rank: int, case: str, plain: Tuple[list, Dict], piped: Tuple[list, Dict], steps: int) -> None:
    """assert_identical to rounding (compiled backward graphs may sum gradients in another order)."""
    (plain_losses, plain_state), (piped_losses, piped_state) = plain, piped
    assert len(piped_losses) == steps, f"rank {rank} {case}: the pipeline trained {len(piped_losses)} of {steps} batches"
    for step, (a, b) in enumerate(zip(plain_losses, piped_losses)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank} {case} step {step}: {m}")
    assert list(plain_state) == list(piped_state)
    for key, value in plain_state.items():
        torch.testing.assert_close(piped_state[key], value, rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank} {key}: {m}")


def check_compiled_autograd_needs_the_python_reducer(rank: int, case: str, W: int) -> None:
    """A DMP whose dense DDP runs the C++ reducer is refused, with the fix; then the fix is applied (in this worker
    process only), so that the DMPs built next can run compiled autograd."""
    import torch._dynamo

    assert torch._dynamo.config.optimize_ddp != "python_reducer"
    dmp, optimizer = build(case, W)
    try:
        train_pipelines.TrainPipelineSparseDistCompAutograd(dmp, optimizer, torch.device("cpu"))
    except ValueError as error:
        assert 'optimize_ddp = "python_reducer" before building' in str(error), f"rank {rank}: {error}"
    else:
        raise AssertionError(f"rank {rank}: a DDP with the C++ reducer was accepted")
    torch._dynamo.config.optimize_ddp = "python_reducer"


ROUNDING = {"TrainPipelineSparseDistCompAutograd"}  # compared with the plain loop to rounding, not bit for bit


def pipeline_classes_worker(rank: int, W: int, runs: List[Tuple], steps: int) -> None:
    """Each (pipeline of train_pipelines, by name; plan[; its keyword arguments]): the plain loop's losses and
    weights bit for bit (to rounding for ROUNDING), the collection pipelined, StopIteration at the end and again
    after."""
    for pipeline_class, case, *kwargs in runs:
        data = batches(rank, W, steps, case)
        if pipeline_class == "TrainPipelineSparseDistCompAutograd":  # its dense DDP must be built for it
            check_compiled_autograd_needs_the_python_reducer(rank, case, W)
        losses, state, info = pipelined(case, data, W, pipeline_class=pipeline_class, **(kwargs[0] if kwargs else {}))
        check_pipelined(rank, f"{pipeline_class} {case}", info, path_of(case))
        compare = assert_close_to if pipeline_class in ROUNDING else assert_identical
        compare(rank, f"{pipeline_class} {case}", plain_loop(case, data, W), (losses, state), steps)


def pipeline_worker(rank: int, W: int, cases: List[str], steps: int) -> None:
    """For every plan: pipeline == plain loop bit for bit (losses every step, every weight at the end); every
    batch trained on; StopIteration at the end and again after; the collection pipelined; its waits counted.
    Then execute_all_batches=False stops with the dataloader, two batches short (TorchRec's behaviour)."""
    for case in cases:
        data = batches(rank, W, steps, case)
        plain = plain_loop(case, data, W)
        losses, state, info = pipelined(case, data, W)
        check_pipelined(rank, case, info)
        assert_identical(rank, case, plain, (losses, state), steps)
    data = batches(rank, W, steps, cases[0])
    plain_losses, plain_state = plain_loop(cases[0], data[:steps - 2], W)
    losses, state, _ = pipelined(cases[0], data, W, execute_all_batches=False)
    assert len(losses) == steps - 2, f"rank {rank}: execute_all_batches=False trained {len(losses)} batches"
    assert all(torch.equal(state[k], v) for k, v in plain_state.items()), f"rank {rank}: weights differ"


def check_eval_pipeline(rank: int, W: int, case: str, steps: int, env=None) -> None:
    """EvalPipelineSparseDist: each batch's output equals the plain forward's, the weights are untouched,
    StopIteration after the last batch, the collection pipelined."""
    data = batches(rank, W, steps, case)
    dmp, _ = build(case, W, env)
    with torch.no_grad():
        expected = [dmp(batch)[1] for batch in data]
    dmp, optimizer = build(case, W, env)
    before = {k: v.clone() for k, v in full_state_dict(dmp).items()}
    pipeline = EvalPipelineSparseDist(dmp, optimizer, torch.device("cpu"))
    feed = iter(data)
    outputs = [pipeline.progress(feed) for _ in data]
    try:
        pipeline.progress(feed)
        raise AssertionError(f"rank {rank} {case}: no StopIteration after the last batch")
    except StopIteration:
        pass
    assert pipeline.pipelined_modules == [path_of(case)], f"rank {rank} {case}: {pipeline.pipelined_modules}"
    for step, (a, b) in enumerate(zip(outputs, expected)):
        assert torch.equal(a, b) and not a.requires_grad, f"rank {rank} {case} step {step}: {a} (pipeline) != {b}"
    assert all(torch.equal(v, before[k]) for k, v in full_state_dict(dmp).items()), f"rank {rank} {case}: weights moved"


def eval_pipeline_worker(rank: int, W: int, cases: List[str], steps: int) -> None:
    for case in cases:
        check_eval_pipeline(rank, W, case, steps)


def local_env() -> ShardingEnv:
    return ShardingEnv.local()


class _TorchRecModel(nn.Module):
    """One TorchRec EmbeddingBagCollection; forward(batch) -> (loss, loss), for TorchRec's own pipeline."""

    def __init__(self) -> None:
        super().__init__()
        import torchrec

        self.ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
            name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"])], device=torch.device("meta"))

    def forward(self, batch):
        loss = self.ebc(batch.sparse_features).values().sum()
        return loss, loss.detach()


def torchrec_steps_worker(rank: int, W: int, counts: List[int], out_file: str) -> None:
    """How many batches TorchRec 1.8's TrainPipelineSparseDist trains on, for each count of batches and each
    execute_all_batches; saved as {(execute_all_batches, batches): steps}; its TrainPipelineFusedSparseDist's
    too, as {("fused", execute_all_batches, batches): steps}."""
    from torchrec.datasets.utils import Batch as TorchRecBatch
    from torchrec.distributed.model_parallel import DistributedModelParallel as TorchRecDMP
    from torchrec.distributed.train_pipeline import TrainPipelineFusedSparseDist as TorchRecFused
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist as TorchRecPipeline
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor as TorchRecKJT

    def batch(i: int):
        kjt = TorchRecKJT.from_lengths_sync(["f"], torch.tensor([i % 10, 1]), torch.tensor([1, 1]))
        return TorchRecBatch(dense_features=torch.zeros(2, 1), sparse_features=kjt, labels=torch.zeros(2))

    run_cpu_shims()  # the fused pipeline's lookup asks torch.cuda for its stream
    steps = {}
    for kind, pipeline_class in (((), TorchRecPipeline), (("fused",), TorchRecFused)):
        for execute_all_batches in (True, False):
            for count in counts:
                dmp = TorchRecDMP(_TorchRecModel(), device=torch.device("cpu"))
                pipeline = pipeline_class(dmp, torch.optim.SGD(dmp.parameters(), lr=0.1), torch.device("cpu"),
                                          execute_all_batches=execute_all_batches)
                steps[(*kind, execute_all_batches, count)] = train_epochs(pipeline, [[batch(i) for i in range(count)]])[0]
    for execute_all_batches in (True, False):  # three epochs of 3 batches, each from a new iterator
        for reset in (False, True):
            dmp = TorchRecDMP(_TorchRecModel(), device=torch.device("cpu"))
            pipeline = TorchRecPipeline(dmp, torch.optim.SGD(dmp.parameters(), lr=0.1), torch.device("cpu"),
                                        execute_all_batches=execute_all_batches)
            steps[("epochs", execute_all_batches, reset)] = train_epochs(pipeline, [[batch(i) for i in range(3)]] * 3,
                                                                         reset)
    torch.save(steps, out_file)


def train_epochs(pipeline, epochs: List, reset: bool = False) -> List[int]:
    """Run the pipeline over each epoch's batches (iter() of each: a list gives a new iterator) to StopIteration, calling reset() after
    each if asked; the number of batches trained in each epoch."""
    trained = []
    for data in epochs:
        feed, count = iter(data), 0
        try:
            while True:
                pipeline.progress(feed)
                count += 1
        except StopIteration:
            trained.append(count)
        if reset:
            pipeline.reset()
    return trained


def epochs_and_detach_worker(rank: int, W: int, case: str, steps: int, env=None) -> None:
    """Three epochs through one pipeline, each from a new iterator: every batch trained on (execute_all_batches)
    or the two loaded ahead carried into the next epoch (execute_all_batches=False, as TorchRec), the weights
    equal to the plain loop over the batches trained. Then detach() after two steps: the model, called outside
    the pipeline on another batch while the pipeline's next batches are in flight, gives what the plain loop's
    model gives after the same two steps; progress() re-attaches and the end weights equal the plain loop's."""
    epochs = [batches(rank, W, steps, case)] * 3
    for execute_all in (True, False):
        dmp, optimizer = build(case, W, env)
        pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), execute_all_batches=execute_all)
        trained = train_epochs(pipeline, epochs)
        expected = [steps] * 3 if execute_all else [steps - 2, steps, steps]
        assert trained == expected, f"rank {rank} {case} execute_all_batches={execute_all}: trained {trained}"
        _, plain_state = plain_loop(case, [b for data in epochs for b in data][:sum(trained)], W, env)
        whole = full_state_dict(dmp)  # (a collective: once, outside the all())
        assert all(torch.equal(whole[k], v) for k, v in plain_state.items()), (
            f"rank {rank} {case} execute_all_batches={execute_all}: weights differ from the plain loop's")

    data, probe = epochs[0], batches(rank, W, steps + 1, case)[-1]
    plain, plain_optimizer = build(case, W, env)
    dmp, optimizer = build(case, W, env)
    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))
    feed = iter(data)
    for batch in data[:2]:
        plain_optimizer.zero_grad()
        plain(batch)[0].backward()
        plain_optimizer.step()
        pipeline.progress(feed)
    model = pipeline.detach()
    assert model is dmp
    with torch.no_grad():
        outside, expected = model(probe)[1], plain(probe)[1]
    assert torch.equal(outside, expected), f"rank {rank} {case}: detached model gave {outside}, plain {expected}"
    assert train_epochs(pipeline, [feed]) == [steps - 2]  # the same iterator (iter(feed) is feed): goes on
    _, plain_state = plain_loop(case, data, W, env)
    whole = full_state_dict(dmp)  # (a collective: once, outside the all())
    assert all(torch.equal(whole[k], v) for k, v in plain_state.items()), (
        f"rank {rank} {case}: weights differ from the plain loop's after detach / attach")
