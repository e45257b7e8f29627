"""DATA_PARALLEL tables in a DistributedModelParallel train as TorchRec 1.8's do, on 2 gloo ranks.

TorchRec gives a DATA_PARALLEL table the DENSE kernel, its lookup wrapped in DistributedDataParallel: the replica is a
plain parameter without `_in_backward_optimizers`, its gradient is averaged over the ranks (DDP's, whatever
set_gradient_division says), the dense optimizer built over in_backward_optimizer_filter(named_parameters())
updates it, and DMP's fused_optimizer does not list it. Both DMPs get the same model (rectoolkit's weights copied
into TorchRec's), the same per-rank batches and the same optimizers (a fused one for the ROW_WISE / TABLE_WISE
tables, a dense Adagrad over the rest); every table's weights and the replica's .grad are compared after each step.
"""

from __future__ import annotations

import pytest
import torch

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


def _batches(rank: int):
    generator = torch.Generator().manual_seed(5 + rank)
    out = []
    for _ in range(STEPS):
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


def training_worker(rank: int, world_size: int, fused: str, division: bool) -> None:
    import torch.distributed as dist

    ours, our_dense, our_kjt = _dmp("rectoolkit", world_size, fused, division)
    theirs, their_dense, their_kjt = _dmp("torchrec", world_size, fused, division)
    our_state = ours.state_dict()
    with torch.no_grad():  # TorchRec's DMP initializes its tables afresh: give it rectoolkit's weights
        for key, value in theirs.state_dict().items():
            if hasattr(value, "local_shards"):
                for shard in value.local_shards():
                    (r, c), (h, w) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                    shard.tensor.copy_(our_state[key][r:r + h, c:c + w])
            else:
                value.copy_(our_state[key])
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
        ours_now, theirs_now = ours.state_dict(), theirs.state_dict()
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


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
@pytest.mark.parametrize("fused, division", [("sgd_in_backward", True), ("adagrad_fused_params", False)])
def test_data_parallel_table_trains_as_torchrec(fused, division):
    run_workers(training_worker, 2, fused, division)
