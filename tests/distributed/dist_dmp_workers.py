"""Workers of the DistributedModelParallel and checkpoint tests (importable by spawned processes)."""

from __future__ import annotations

from typing import Optional

import torch

from rectoolkit.distributed import full_state_dict
from torch import nn

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, load_checkpoint, save_checkpoint
from rectoolkit.optim import CombinedOptimizer
from rectoolkit.plan.types import ShardingPlan
from dist_harness import global_batch, make_batch
from dist_workers import BATCH, bag_tables, dense_and_replicas, plan_for

PATH = "sparse.ebc"


class TinyModel(nn.Module):
    """Dense features -> Linear; sparse features -> EmbeddingBagCollection; both -> Linear."""

    def __init__(self, optimizer: Optional[str] = "adagrad") -> None:
        super().__init__()
        tables = bag_tables()
        self.sparse = nn.Module()
        fused = dict(optimizer=optimizer, lr=0.1) if optimizer else {}  # None: plain gradients
        self.sparse.ebc = rtk.EmbeddingBagCollection(tables, **fused)
        self.dense = nn.Linear(3, 8)
        self.over = nn.Linear(8 + sum(t.embedding_dim * len(t.feature_names) for t in tables), 1)

    def forward(self, dense_x: torch.Tensor, kjt) -> torch.Tensor:
        embedded = self.sparse.ebc(kjt).values()
        return self.over(torch.cat([torch.relu(self.dense(dense_x)), embedded], 1)).squeeze(1)


def features():
    return {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}


def step_batches(step: int, W: int):
    kjts = [make_batch(features(), BATCH, seed=1000 * step + r) for r in range(W)]
    dense = [torch.randn(BATCH, 3, generator=torch.Generator().manual_seed(77 + 1000 * step + r)) for r in range(W)]
    return kjts, dense


def expected_memory(plan, rank: int) -> int:
    """Bytes of this rank's shards, straight from the plan (fp32)."""
    total = 0
    for ps in plan.values():
        for shard in ps.shards:
            if shard.rank == rank:
                total += 4 * shard.num_elements
    return total


def dmp_worker(rank: int, W: int, L: int, checkpoint_dir: str, reference_file: str) -> None:
    """DMP vs the unsharded model over 2 steps; state_dict round trip; memory; save under plan A, load under B."""
    lr = 0.1
    torch.manual_seed(0)
    reference = TinyModel()
    torch.manual_seed(0)
    model = TinyModel()
    plan_a = plan_for("mixed_a", bag_tables(), W, L)
    dmp = DistributedModelParallel(model, plan=ShardingPlan({PATH: plan_a}), local_world_size=L)
    dense, replicas = dense_and_replicas(dmp)
    dense_opt = torch.optim.SGD(dense, lr=lr)
    # the DATA_PARALLEL replicas have the dense kernel (TorchRec's): torch's Adagrad, the reference's fused rule
    assert len(replicas) == sum(ps.sharding_type == "data_parallel" for ps in plan_a.values()) > 0
    replica_opt = torch.optim.Adagrad(replicas, lr=lr, eps=1e-8)
    optimizer = CombinedOptimizer([("fused", dmp.fused_optimizer), ("dense", dense_opt), ("replicas", replica_opt)])
    ref_dense = [p for n, p in reference.named_parameters() if not n.startswith("sparse.")]
    # DDP averages the dense gradients and TorchRec's division by W the embedding ones: the reference's loss is the
    # mean of the ranks' losses
    ref_opt = torch.optim.SGD(ref_dense, lr=lr)
    for step in range(2):
        kjts, dense = step_batches(step, W)
        out = dmp(dense[rank], kjts[rank])
        ref_out = reference(torch.cat(dense), global_batch(kjts))
        mine = ref_out[rank * BATCH:(rank + 1) * BATCH]
        assert torch.allclose(out, mine, atol=1e-5), f"rank {rank} step {step}: outputs differ by {(out - mine).abs().max()}"
        (out.square().sum() * 0.01).backward()
        (ref_out.square().sum() * 0.01 / W).backward()
        optimizer.step()
        optimizer.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
    state = full_state_dict(dmp)
    ref_state = reference.state_dict()
    # the unsharded model's keys, sorted as TorchRec's DMP sorts them
    assert list(state) == sorted(ref_state), f"state_dict keys {list(state)} != {sorted(ref_state)}"
    for key, value in ref_state.items():
        assert state[key].shape == value.shape, key
        assert torch.allclose(state[key], value, atol=1e-5), f"{key}: differs by {(state[key] - value).abs().max()}"
    # load_state_dict of global tensors: each rank takes its slice; gathering again gives the same bits
    dmp.load_state_dict(ref_state)
    again = full_state_dict(dmp)
    assert all(torch.equal(again[k], v) for k, v in ref_state.items())
    # memory: shard weights + fused Adagrad state (one float per weight of the fused shards) as the plan says
    usage = dmp.memory_usage()
    assert usage["embedding_weights"] == expected_memory(plan_a, rank), usage
    replica_bytes = expected_memory({t: ps for t, ps in plan_a.items() if ps.sharding_type == "data_parallel"}, rank)
    assert usage["embedding_optimizer"] == usage["embedding_weights"] - replica_bytes, usage
    # checkpoint under plan A, reload under plan B (another type for every table): bit-identical
    save_checkpoint(dmp, checkpoint_dir, dense_optimizer=dense_opt, extra={"step": 2})
    if rank == 0:
        torch.save(again, reference_file)
    torch.manual_seed(123)  # other initial weights: the checkpoint must overwrite them all
    plan_b = plan_for("mixed_b", bag_tables(), W, L)
    # (without a fused optimizer: the tables plan A replicates saved no fused state, their Adagrad's is replica_opt's)
    other = DistributedModelParallel(TinyModel(optimizer=None), plan=ShardingPlan({PATH: plan_b}), local_world_size=L)
    extra = load_checkpoint(other, checkpoint_dir)
    assert extra == {"step": 2}
    loaded = full_state_dict(other)
    assert all(torch.equal(loaded[k], v) for k, v in again.items()), "weights changed in the plan A -> B round trip"
    kinds = {ps.sharding_type for ps in plan_b.values()} | {ps.sharding_type for ps in plan_a.values()}
    assert len(kinds) >= 5, kinds
    # no plan: rectoolkit.planner decides (on rank 0, broadcast); the model still computes the same outputs
    planned = DistributedModelParallel(TinyModel(), local_world_size=L)
    planned.load_state_dict(again)
    kjts, dense = step_batches(5, W)
    with torch.no_grad():
        expected = other(dense[rank], kjts[rank])
        got = planned(dense[rank], kjts[rank])
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert set(planned.plan.plan) == {PATH}


def unsharded_collection_worker(rank: int, W: int) -> None:
    """sharders without one for the model's EmbeddingBagCollection: TorchRec leaves it unsharded, a replica on
    every rank under DDP. One SGD step must move every replica as the mean of the ranks' gradients, worked out
    here on an unsharded copy, batch by batch."""
    import copy

    from rectoolkit.distributed.sharders import EmbeddingCollectionSharder

    torch.manual_seed(0)
    model = TinyModel(optimizer=None)
    reference = copy.deepcopy(model)
    dmp = DistributedModelParallel(model, sharders=[EmbeddingCollectionSharder()], local_world_size=W)
    assert type(dmp.module.sparse.ebc) is rtk.EmbeddingBagCollection and dmp.plan.plan == {}
    optimizer = torch.optim.SGD(dmp.parameters(), lr=0.5)
    kjts, dense = step_batches(0, W)
    dmp(dense[rank], kjts[rank]).sum().backward()
    optimizer.step()
    grads = []
    for r in range(W):
        reference.zero_grad()
        reference(dense[r], kjts[r]).sum().backward()
        grads.append({name: p.grad.clone() for name, p in reference.named_parameters()})
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p -= 0.5 * sum(g[name] for g in grads) / W
    for name, p in reference.named_parameters():
        assert torch.allclose(dmp.module.get_parameter(name), p, atol=1e-6), f"rank {rank}: {name}"

    fused = TinyModel(optimizer="adagrad")  # a fused update of a replica would apply only this rank's gradient
    try:
        DistributedModelParallel(fused, sharders=[EmbeddingCollectionSharder()], local_world_size=W)
    except ValueError as error:
        assert "'sparse.ebc' stays unsharded" in str(error) and "diverge" in str(error), error
    else:
        raise AssertionError("an unsharded collection with a fused optimizer was accepted")
