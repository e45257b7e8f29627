"""DATA_PARALLEL tables in a DistributedModelParallel train as TorchRec 1.8's do, on 2 gloo ranks.

TorchRec gives a DATA_PARALLEL table the DENSE kernel, its lookup wrapped in DistributedDataParallel: the replica is a
plain parameter without `_in_backward_optimizers`, its gradient is averaged over the ranks (DDP's, whatever
set_gradient_division says), the dense optimizer built over in_backward_optimizer_filter(named_parameters())
updates it, and DMP's fused_optimizer does not list it. Both DMPs get the same model (rectoolkit's weights copied
into TorchRec's), the same per-rank batches and the same optimizers (a fused one for the ROW_WISE / TABLE_WISE
tables, a dense Adagrad over the rest); every table's weights and the replica's .grad are compared after each step.
Under both libraries' GradientAccumulationWrapper, rectoolkit's replicas skip their all-reduce on the no-sync
micro-batches, as DDP's no_sync (accumulation_worker says what is compared).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from rectoolkit.distributed import full_state_dict

from dist_harness import run_workers

torchrec = pytest.importorskip("torchrec")

# name, rows, dim, sharding
TABLES = [("dp", 7, 4, "data_parallel"), ("rw", 9, 4, "row_wise"), ("tw", 6, 4, "table_wise")]
FEATURES = [f"f_{name}" for name, _, _, _ in TABLES]
STEPS = 3


class Model(torch.nn.Module):
    """An EBC and a Linear over its pooled output (the Linear is DDP's in both DMPs)."""

    def __init__(self, lib) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ebc = lib.EmbeddingBagCollection(tables=[
            lib.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f_{name}"])
            for name, rows, dim, _ in TABLES], device=torch.device("cpu"))
        self.over = torch.nn.Linear(sum(dim for _, _, dim, _ in TABLES), 1)

    def forward(self, kjt):
        return self.over(self.ebc(kjt).values()).squeeze(1)


def _batches(rank: int, steps: int = STEPS):
    generator = torch.Generator().manual_seed(5 + rank)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 4, (3 * len(TABLES),), generator=generator)
        values = torch.cat([torch.randint(0, rows, (int(lengths[3 * i:3 * i + 3].sum()),), generator=generator)
                            for i, (_, rows, _, _) in enumerate(TABLES)])
        out.append((values, lengths))
    return out


def _dmp(lib_name: str, world_size: int, fused: str, division: bool):
    """(DMP, dense optimizer, the lib's KeyedJaggedTensor) with `fused` ("sgd_in_backward": torch SGD applied in
    backward; "adagrad_fused_params": the sharder's fused Adagrad) for the model-parallel tables."""
    from importlib import import_module

    root = "torchrec" if lib_name == "torchrec" else "rectoolkit"
    lib = import_module(root)
    mp = import_module(f"{root}.distributed.model_parallel")
    sp = import_module(f"{root}.distributed.sharding_plan")
    sharder_class = import_module(f"{root}.distributed.embeddingbag").EmbeddingBagCollectionSharder
    import_module(f"{root}.distributed.comm_ops").set_gradient_division(division)
    keyed = import_module(f"{root}.optim.keyed")
    optimizers = import_module(f"{root}.optim.optimizers")

    model = Model(lib)
    fused_params = None
    if fused == "sgd_in_backward":
        import_module(f"{root}.optim.apply_optimizer_in_backward").apply_optimizer_in_backward(
            torch.optim.SGD, model.ebc.parameters(), {"lr": 0.3})
    else:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        fused_params = {"optimizer": EmbOptimType.EXACT_ADAGRAD if lib_name == "torchrec" else "exact_adagrad",
                        "learning_rate": 0.3, "eps": 1e-8}
    kinds = {"data_parallel": sp.data_parallel(), "row_wise": sp.row_wise(), "table_wise": sp.table_wise(rank=1)}
    module_plan = sp.construct_module_sharding_plan(
        model.ebc, {name: kinds[kind] for name, _, _, kind in TABLES}, world_size=world_size, device_type="cpu")
    dmp = mp.DistributedModelParallel(model, device=torch.device("cpu"), plan=mp.ShardingPlan({"ebc": module_plan}),
                                      sharders=[sharder_class(fused_params=fused_params)])
    dense = keyed.KeyedOptimizerWrapper(dict(optimizers.in_backward_optimizer_filter(dmp.named_parameters())),
                                        lambda params: torch.optim.Adagrad(params, lr=0.2))
    return dmp, dense, lib.KeyedJaggedTensor


def _facts(dmp, dense) -> dict:
    params = dict(dmp.named_parameters())
    return {"named_parameters": list(params),
            "in_backward": sorted(name for name, p in params.items() if hasattr(p, "_in_backward_optimizers")),
            "fused_optimizer_params": sorted(dmp.fused_optimizer.params),
            "dense_optimizer_params": sorted(dense.params),
            "sparse_grad_parameter_names": list(dmp.sparse_grad_parameter_names())}


def _whole(value) -> torch.Tensor:
    """A state_dict value as this rank's view: a plain tensor, or TorchRec's ShardedTensor's local shards placed
    into a NaN tensor of the whole table (so only the slices this rank holds compare)."""
    if not hasattr(value, "local_shards"):
        return value.detach().clone()
    out = torch.full(tuple(value.size()), float("nan"))
    for shard in value.local_shards():
        (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
        out[r:r + h, c:c + w] = shard.tensor.detach()
    return out


def _copy_weights(ours, theirs) -> dict:
    """TorchRec's DMP initializes its tables afresh: give it rectoolkit's weights (rectoolkit's state, returned)."""
    our_state = {k: v.clone() for k, v in full_state_dict(ours).items()}  # (a replica in it is a view, as in TorchRec)
    with torch.no_grad():
        for key, value in theirs.state_dict().items():
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(our_state[key][r:r + h, c:c + w])
            else:
                value.copy_(our_state[key])
    return our_state


def training_worker(rank: int, world_size: int, fused: str, division: bool) -> None:
    import torch.distributed as dist

    ours, our_dense, our_kjt = _dmp("rectoolkit", world_size, fused, division)
    theirs, their_dense, their_kjt = _dmp("torchrec", world_size, fused, division)
    our_state = _copy_weights(ours, theirs)
    assert _facts(ours, our_dense) == _facts(theirs, their_dense)
    facts = _facts(ours, our_dense)
    assert "ebc.embedding_bags.dp.weight" in facts["dense_optimizer_params"]
    assert "ebc.embedding_bags.dp.weight" not in facts["fused_optimizer_params"] + facts["in_backward"]
    assert type(theirs.state_dict()["ebc.embedding_bags.dp.weight"]) is torch.Tensor  # a plain replica in both
    our_replica = dict(ours.named_parameters())["ebc.embedding_bags.dp.weight"]
    their_replica = dict(theirs.named_parameters())["ebc.embedding_bags.dp.weight"]
    for step, (values, lengths) in enumerate(_batches(rank)):
        for dmp, dense, kjt in ((ours, our_dense, our_kjt), (theirs, their_dense, their_kjt)):
            out = dmp(kjt.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths))
            (out * torch.arange(1.0, out.numel() + 1)).sum().backward()
        torch.testing.assert_close(our_replica.grad, their_replica.grad, atol=1e-6, rtol=1e-6,
                                   msg=lambda m: f"rank {rank} step {step} replica grad: {m}")
        for dense in (our_dense, their_dense):
            dense.step()
            dense.zero_grad()
        ours_now, theirs_now = full_state_dict(ours), theirs.state_dict()
        assert sorted(ours_now) == sorted(theirs_now)
        for key, their_value in theirs_now.items():
            expected = _whole(their_value)
            held = ~expected.isnan()  # (tw: rank 1's only)
            torch.testing.assert_close(ours_now[key][held], expected[held], atol=1e-6, rtol=1e-6,
                                       msg=lambda m: f"rank {rank} step {step} {key}: {m}")
        # the replicas moved, and stayed equal across the ranks
        replicas = [torch.empty_like(our_replica) for _ in range(world_size)]
        dist.all_gather(replicas, our_replica.detach())
        assert all(torch.equal(replicas[0], r) for r in replicas[1:])
    assert not torch.equal(our_replica.detach(), our_state["ebc.embedding_bags.dp.weight"])


# ------------------------------------------------------------------------------------------------ accumulation
class _Step:
    """The smallest pipeline GradientAccumulationWrapper wraps (both libraries'): zero_grad, forward, backward, step
    of the optimizer it holds as `_optimizer`."""

    def __init__(self, dmp, optimizer, kjt) -> None:
        self._dmp, self._optimizer, self._kjt = dmp, optimizer, kjt

    def progress(self, batches):
        values, lengths = next(batches)
        self._optimizer.zero_grad()
        out = self._dmp(self._kjt.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths))
        loss = (out * torch.arange(1.0, out.numel() + 1)).sum()
        loss.backward()
        self._optimizer.step()
        return loss.detach()


def accumulation_worker(rank: int, world_size: int, fused: str, division: bool) -> None:
    """GradientAccumulationWrapper (num_steps 3, 8 micro-batches: all-reduced at 0, 2, 5; the partial last group
    stepped at StopIteration) around both libraries' DMPs. rectoolkit's replicas send dp_allreduce on the synced micro-batches only, each the bytes of one
    all-reduce of the table; under no_sync their .grad holds this rank's own gradient (DDP's no_sync). TorchRec
    1.8's wrapper does not reach the DDP of its ShardedEmbeddingBagCollection's DATA_PARALLEL lookups (they sit in
    a plain list, not a submodule), so its replicas all-reduce in every micro-batch: its .grad is the mean of
    ours over the ranks there, and on the synced micro-batches the .grad and the weights equal ours. A hand loop
    under `dmp.no_sync()` gives the wrapper's numbers exactly, and one that all-reduces every micro-batch the same
    to float rounding. At StopIteration rectoolkit all-reduces what the partial group's replicas accumulated
    before the step (once), so the replicas stay equal on every rank and equal TorchRec's."""
    import torch.distributed as dist

    from rectoolkit.distributed.train_pipeline import gradient_accumulation as ours_ga
    from torchrec.distributed.train_pipeline import gradient_accumulation as their_ga

    num_steps, synced = 3, [True, False, True, False, False, True, False, False]
    runs = {}
    for lib_name, ga in (("rectoolkit", ours_ga), ("torchrec", their_ga)):
        dmp, dense, kjt = _dmp(lib_name, world_size, fused, division)
        runs[lib_name] = (dmp, ga.GradientAccumulationWrapper(_Step(dmp, dense, kjt), dense, dmp,
                                                             ga.GradientAccumulationConfig(num_steps=num_steps)))
    _copy_weights(runs["rectoolkit"][0], runs["torchrec"][0])
    hand = {how: _dmp("rectoolkit", world_size, fused, division) for how in ("no_sync", "every_batch")}
    replica = {name: dict(dmp.named_parameters())["ebc.embedding_bags.dp.weight"]
               for name, dmp in [(lib, run[0]) for lib, run in runs.items()] + [(h, d[0]) for h, d in hand.items()]}
    env = runs["rectoolkit"][0].env
    table_values = 7 * 4  # the dp table, rows x dim: chunks of 14 values, rank i sending rank j 4 * (14 + 14) bytes
    for step, batch in enumerate(_batches(rank, len(synced))):
        where = f"rank {rank} micro-batch {step} ({'synced' if synced[step] else 'no_sync'})"
        env.stats.reset()
        for _, wrapper in runs.values():
            wrapper.progress(iter([batch]))
        sent = env.stats.bytes_sent.get("dp_allreduce")
        if synced[step]:
            assert env.stats.calls["dp_allreduce"] == 1 and sent.tolist() == [4 * table_values] * world_size, where
        else:
            assert sent is None, (where, sent)
        for how, (dmp, dense, kjt) in hand.items():
            if step % num_steps == 0:
                dense.zero_grad(set_to_none=True)  # as the wrapper's
            with dmp.no_sync() if how == "no_sync" and not synced[step] else contextlib.nullcontext():
                if how == "no_sync" and not synced[step]:
                    assert not dmp._dmp_wrapped_module.require_backward_grad_sync  # the dense DDP's too
                out = dmp(kjt.from_lengths_sync(keys=FEATURES, values=batch[0], lengths=batch[1]))
                (out * torch.arange(1.0, out.numel() + 1)).sum().backward()
            if (step + 1) % num_steps == 0:
                dense.step()
        ours_on_ranks = [torch.empty_like(replica["rectoolkit"]) for _ in range(world_size)]
        theirs_on_ranks = [torch.empty_like(replica["torchrec"]) for _ in range(world_size)]
        dist.all_gather(ours_on_ranks, replica["rectoolkit"].grad)
        dist.all_gather(theirs_on_ranks, replica["torchrec"].grad)
        assert all(torch.equal(theirs_on_ranks[0], g) for g in theirs_on_ranks[1:]), where  # all-reduced
        assert synced[step] == all(torch.equal(ours_on_ranks[0], g) for g in ours_on_ranks[1:]), where
        torch.testing.assert_close(sum(ours_on_ranks) / world_size, replica["torchrec"].grad, atol=1e-6, rtol=1e-6,
                                   msg=lambda m: f"{where} replica grad (mean over the ranks) against TorchRec's: {m}")
        assert torch.equal(replica["rectoolkit"].grad, replica["no_sync"].grad), where
        assert torch.equal(replica["rectoolkit"].detach(), replica["no_sync"].detach()), where
        torch.testing.assert_close(replica["rectoolkit"].detach(), replica["torchrec"].detach(), atol=1e-6, rtol=1e-6,
                                   msg=lambda m: f"{where} replica against TorchRec's: {m}")
        if synced[step]:  # all-reduced: what an all-reduce in every micro-batch gives
            torch.testing.assert_close(replica["rectoolkit"].grad, replica["every_batch"].grad, atol=1e-6, rtol=1e-6,
                                       msg=lambda m: f"{where} replica grad against every micro-batch's: {m}")
            torch.testing.assert_close(replica["rectoolkit"].detach(), replica["every_batch"].detach(), atol=1e-6,
                                       rtol=1e-6, msg=lambda m: f"{where} replica against every micro-batch's: {m}")
    env.stats.reset()
    for _, wrapper in runs.values():
        with pytest.raises(StopIteration):
            wrapper.progress(iter([]))
    assert env.stats.calls == {"dp_allreduce": 1}, env.stats.calls  # the partial group's, before its step
    for how, (dmp, dense, _) in hand.items():
        if how == "no_sync":
            dmp.sharded_modules["ebc"].reduce_accumulated_gradients()
        dense.step()
    finals = {name: weight.detach() for name, weight in replica.items()}
    on_ranks = [torch.empty_like(finals["rectoolkit"]) for _ in range(world_size)]
    dist.all_gather(on_ranks, finals["rectoolkit"])
    assert all(torch.equal(on_ranks[0], weight) for weight in on_ranks[1:]), f"rank {rank}: replicas differ"
    assert torch.equal(finals["rectoolkit"], finals["no_sync"]), rank
    for other in ("torchrec", "every_batch"):
        torch.testing.assert_close(finals["rectoolkit"], finals[other], atol=1e-6, rtol=1e-6,
                                   msg=lambda m: f"rank {rank} replica after the last step against {other}: {m}")
    ours_now, theirs_now = full_state_dict(runs["rectoolkit"][0]), runs["torchrec"][0].state_dict()
    for key, their_value in theirs_now.items():
        expected = _whole(their_value)
        held = ~expected.isnan()
        torch.testing.assert_close(ours_now[key][held], expected[held], atol=1e-6, rtol=1e-6,
                                   msg=lambda m: f"rank {rank} {key} after accumulation: {m}")


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fused, division", [("sgd_in_backward", True), ("adagrad_fused_params", False)])
@pytest.mark.parametrize("worker", [training_worker, accumulation_worker], ids=["steps", "accumulation"])
def test_data_parallel_table_trains_as_torchrec(worker, fused, division):
    run_workers(worker, 2, fused, division)
