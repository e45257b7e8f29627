"""Worker of the sharded FeatureProcessedEmbeddingBagCollection test (importable by spawned processes).

A model holding a FeatureProcessedEmbeddingBagCollection (position weights, fused Adagrad tables) under
DistributedModelParallel on W ranks against the same model unsharded on the global batch: outputs, then every
weight (tables, dense layer) after 2 training steps. The position weights are frozen: trainable ones are refused
by the sharded collection (their gradient does not cross the input_dist yet), which is checked too.
"""

from __future__ import annotations

from typing import Optional

import torch

from rectoolkit.distributed import full_state_dict
from torch import nn

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, EmbeddingBagCollectionSharder, ShardingEnv
from rectoolkit.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from rectoolkit.modules.feature_processor_ import PositionWeightedModuleCollection
from rectoolkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from rectoolkit.optim import CombinedOptimizer
from rectoolkit.plan.types import ShardingPlan
from dist_harness import global_batch, make_batch
from dist_workers import BATCH, bag_tables, dense_and_replicas, plan_for


class PositionWeightedModel(nn.Module):
    """Sparse features -> position weights -> weighted EmbeddingBagCollection -> Linear."""

    def __init__(self, train_position_weights: bool = False, optimizer: Optional[str] = "adagrad",
                 lr: Optional[float] = 0.1) -> None:
        super().__init__()
        tables = bag_tables()
        features = [f for t in tables for f in t.feature_names]
        ebc = rtk.EmbeddingBagCollection(tables, is_weighted=True, optimizer=optimizer, lr=lr)
        self.fp = FeatureProcessedEmbeddingBagCollection(ebc, PositionWeightedModuleCollection({f: 4 for f in features}))
        with torch.no_grad():  # not all ones, so a wrong position shows
            for weight in self.fp._feature_processors.position_weights.values():
                weight.copy_(torch.linspace(1.0, 0.25, weight.numel()))
                weight.requires_grad_(train_position_weights)
        self.over = nn.Linear(sum(t.embedding_dim * len(t.feature_names) for t in tables), 1)

    def forward(self, kjt) -> torch.Tensor:
        return self.over(self.fp(kjt).values()).squeeze(1)


def fp_dmp_worker(rank: int, W: int, cases: list, plan_key: str) -> None:
    """`plan_key`: the module path the plan is keyed by (the inner collection's, or the FP collection's as
    TorchRec keys it)."""
    features = {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}
    for case in cases:
        torch.manual_seed(0)
        reference = PositionWeightedModel()
        torch.manual_seed(0)
        dmp = DistributedModelParallel(PositionWeightedModel(),
                                       plan=ShardingPlan({plan_key: plan_for(case, bag_tables(), W, W)}),
                                       local_world_size=W)
        dense, replicas = dense_and_replicas(dmp)
        dense_opt = torch.optim.SGD(dense, lr=0.1)
        # the DATA_PARALLEL replicas have the dense kernel (TorchRec's): torch's Adagrad, the reference's fused rule
        replica_opt = torch.optim.Adagrad(replicas, lr=0.1, eps=1e-8) if replicas else None
        optimizer = CombinedOptimizer([("fused", dmp.fused_optimizer), ("dense", dense_opt)]
                                      + ([("replicas", replica_opt)] if replicas else []))
        ref_dense = [p for n, p in reference.named_parameters() if "embedding_bags" not in n and p.requires_grad]
        # DDP averages the dense gradients, TorchRec's division by W the embedding ones: the mean of the losses
        ref_opt = torch.optim.SGD(ref_dense, lr=0.1)
        for step in range(2):
            kjts = [make_batch(features, BATCH, seed=1000 * step + r) for r in range(W)]
            out = dmp(kjts[rank])
            ref_out = reference(global_batch(kjts))
            mine = ref_out[rank * BATCH:(rank + 1) * BATCH]
            where = f"rank {rank}, case {case}, step {step}"
            assert torch.allclose(out, mine, atol=1e-5), f"{where}: outputs differ by {(out - mine).abs().max()}"
            out.square().sum().backward()
            (ref_out.square().sum() / W).backward()
            optimizer.step()
            optimizer.zero_grad()
            ref_opt.step()
            ref_opt.zero_grad()
        state, ref_state = full_state_dict(dmp), reference.state_dict()
        # the unsharded model's keys, sorted as TorchRec's DMP sorts them
        assert list(state) == sorted(ref_state), f"state_dict keys {list(state)} != {sorted(ref_state)}"
        for key, value in ref_state.items():
            assert torch.allclose(state[key], value, atol=1e-5), f"{case} {key}: differs by {(state[key] - value).abs().max()}"
    trainable = DistributedModelParallel(PositionWeightedModel(train_position_weights=True),
                                         plan=ShardingPlan({plan_key: plan_for(cases[0], bag_tables(), W, W)}),
                                         local_world_size=W)
    try:
        trainable(make_batch(features, BATCH, seed=rank))
    except ValueError as error:
        assert "per-id weights require grad" in str(error) and "freeze them" in str(error), error
    else:
        raise AssertionError(f"rank {rank}: trainable position weights were not refused")


def fp_sharder_worker(rank: int, W: int) -> None:
    """TorchRec's FeatureProcessedEmbeddingBagCollectionSharder: DMP plans the model with it (the plan keyed by the
    collection's own path, "fp", as TorchRec's) and its inner sharder's fused_params (SGD, lr 0.5) train the tables,
    not the collection's own Adagrad; `shard()` shards a copy of the collection and leaves the original as it was."""
    features = {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}
    fused = {"optimizer": "exact_sgd", "learning_rate": 0.5}  # (TorchRec code passes fbgemm's EmbOptimType.EXACT_SGD)
    torch.manual_seed(0)
    reference = PositionWeightedModel(optimizer="sgd", lr=0.5)
    torch.manual_seed(0)
    sharder = FeatureProcessedEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder(fused_params=fused))
    dmp = DistributedModelParallel(PositionWeightedModel(optimizer=None, lr=None), sharders=[sharder], local_world_size=W)
    assert list(dmp.plan.plan) == ["fp"], f"rank {rank}: plan keyed by {list(dmp.plan.plan)}, TorchRec keys it by 'fp'"
    kjts = [make_batch(features, BATCH, seed=r) for r in range(W)]
    out, ref_out = dmp(kjts[rank]), reference(global_batch(kjts))
    assert torch.allclose(out, ref_out[rank * BATCH:(rank + 1) * BATCH], atol=1e-5), f"rank {rank}: outputs differ"
    out.square().sum().backward()  # the tables step in backward (fused); the dense layer is not stepped here
    (ref_out.square().sum() / W).backward()
    # the tables the planner replicates have the dense kernel (TorchRec's): stepped by the fused rule's torch SGD
    replicas = dense_and_replicas(dmp)[1]
    if replicas:
        torch.optim.SGD(replicas, lr=0.5).step()
    state, ref_state = full_state_dict(dmp), reference.state_dict()
    for key in [k for k in ref_state if "embedding_bags" in k]:
        assert torch.allclose(state[key], ref_state[key], atol=1e-5), \
            f"rank {rank}, {key}: the fused SGD of the sharder's fused_params was not used"

    torch.manual_seed(0)
    model = PositionWeightedModel(optimizer=None, lr=None)
    original = model.fp._embedding_bag_collection
    env = ShardingEnv.from_process_group(local_world_size=W)
    sharded = sharder.shard(model.fp, plan_for("row_wise", bag_tables(), W, W), env)
    assert model.fp._embedding_bag_collection is original, "shard() changed the module it was given"
    assert sharded is not model.fp and sharded._feature_processors is model.fp._feature_processors
    torch.manual_seed(0)
    expected = PositionWeightedModel().fp(global_batch(kjts)).values()[rank * BATCH:(rank + 1) * BATCH]
    got = sharded(kjts[rank])
    got = got.wait() if hasattr(got, "wait") else got
    assert torch.allclose(got.values(), expected, atol=1e-5), f"rank {rank}: sharder.shard() output differs"
