"""Workers of the TrainPipelineSemiSync tests: TorchRec 1.8's TrainPipelineSemiSync and rectoolkit's on the same
model, weights, plan and batches (the same code builds both, with `lib` = torchrec or rectoolkit), and the plain
loop, which semi-sync must differ from (importable by spawned processes)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from torch import nn

import rectoolkit as rtk
from rectoolkit.distributed import full_state_dict
from rectoolkit.train.data import Batch
from dist_harness import load_torchrec_shards, run_cpu_shims

TABLES = [("t0", 9, ["f0"]), ("t1", 11, ["f1"])]  # name, rows, features; dim 4
LOCAL_BATCH = 3


class SemiSyncModel(nn.Module):
    """An EmbeddingBagCollection (or with sequences=True an EmbeddingCollection) under a nonlinear dense part, so
    that embeddings one step stale change the loss."""

    def __init__(self, lib, sequences: bool = False) -> None:
        super().__init__()
        self.sequences = sequences
        if sequences:
            self.emb = lib.EmbeddingCollection(tables=[
                lib.EmbeddingConfig(name=name, num_embeddings=rows, embedding_dim=4, feature_names=features)
                for name, rows, features in TABLES], device=torch.device("cpu"))
            self.dense = nn.Linear(4, 1)
        else:
            self.emb = lib.EmbeddingBagCollection(tables=[
                lib.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=4, feature_names=features)
                for name, rows, features in TABLES], device=torch.device("cpu"))
            self.dense = nn.Linear(4 * len(TABLES), 1)

    def forward(self, batch) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.sequences:  # one row per id
            sequences = self.emb(batch.sparse_features)  # (by name, not iterated: TorchRec traces this forward)
            rows = torch.cat([sequences[f].values() for _, _, features in TABLES for f in features])
            loss = (torch.tanh(self.dense(rows)).squeeze(1) - 0.5).square().mean()
        else:
            pooled = self.emb(batch.sparse_features).values()
            loss = (torch.tanh(self.dense(pooled)).squeeze(1) - batch.labels).square().mean()
        return loss, loss.detach()

    def tables(self) -> nn.ModuleDict:
        return self.emb.embeddings if self.sequences else self.emb.embedding_bags


def unsharded_weights(sequences: bool) -> Dict[str, torch.Tensor]:
    """The starting weights of both libraries' models (tables by table name, dense by parameter name)."""
    torch.manual_seed(0)
    model = SemiSyncModel(rtk, sequences)
    weights = {name: model.tables()[name].weight.detach().clone() for name, _, _ in TABLES}
    weights.update({f"dense.{k}": v.detach().clone() for k, v in model.dense.state_dict().items()})
    return weights


def build(lib, W: int, weights: Dict[str, torch.Tensor], sequences: bool):
    """A DMP of SemiSyncModel (t0 table-wise on the last rank, t1 row-wise; fused SGD in backward) starting from
    `weights`, and an SGD optimizer of its dense parameters."""
    if lib is rtk:
        from rectoolkit.distributed import embedding, embeddingbag, model_parallel, sharding_plan
        optimizer_name = "exact_sgd"
    else:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from torchrec.distributed import embedding, embeddingbag, model_parallel, sharding_plan
        optimizer_name = EmbOptimType.EXACT_SGD
    sharder_class = embedding.EmbeddingCollectionSharder if sequences else embeddingbag.EmbeddingBagCollectionSharder
    model = SemiSyncModel(lib, sequences)
    with torch.no_grad():
        for name, _, _ in TABLES:
            model.tables()[name].weight.copy_(weights[name])
        model.dense.weight.copy_(weights["dense.weight"])
        model.dense.bias.copy_(weights["dense.bias"])
    plan = sharding_plan.construct_module_sharding_plan(model.emb, {
        "t0": sharding_plan.table_wise(rank=W - 1, compute_kernel="fused"),
        "t1": sharding_plan.row_wise(compute_kernel="fused")}, world_size=W, device_type="cpu")
    sharder = sharder_class(fused_params={"optimizer": optimizer_name, "learning_rate": 0.5})
    dmp = model_parallel.DistributedModelParallel(model, device=torch.device("cpu"),
                                                  plan=model_parallel.ShardingPlan({"emb": plan}), sharders=[sharder])
    if lib is not rtk:  # TorchRec's DMP initializes its shards afresh: give them the starting weights
        load_torchrec_shards(dmp.module.emb, weights)
    optimizer = lib.optim.keyed.KeyedOptimizerWrapper(
        dict(lib.optim.optimizers.in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.SGD(params, lr=0.1))
    return dmp, optimizer


def batches(lib, rank: int, steps: int) -> List:
    generator = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        lengths = torch.randint(0, 3, (LOCAL_BATCH * len(TABLES),), generator=generator)
        values = torch.cat([torch.randint(0, rows, (int(lengths[k * LOCAL_BATCH:(k + 1) * LOCAL_BATCH].sum()),),
                                          generator=generator) for k, (_, rows, _) in enumerate(TABLES)])
        kjt = lib.KeyedJaggedTensor.from_lengths_sync([f for _, _, fs in TABLES for f in fs], values, lengths)
        labels = torch.rand(LOCAL_BATCH, generator=generator)
        out.append(_torchrec_batch(kjt, labels) if lib is not rtk else Batch(torch.zeros(LOCAL_BATCH, 1), kjt, labels))
    return out


def _torchrec_batch(kjt, labels):
    from torchrec.datasets.utils import Batch as TorchRecBatch

    return TorchRecBatch(dense_features=torch.zeros(LOCAL_BATCH, 1), sparse_features=kjt, labels=labels)


def train(pipeline, data: List) -> List[torch.Tensor]:
    feed, losses = iter(data), []
    while True:
        try:
            losses.append(pipeline.progress(feed))
        except StopIteration:
            return losses


def plain_loop(dmp, optimizer, data: List) -> List[torch.Tensor]:
    losses = []
    for batch in data:
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def local_slices(dmp) -> Dict[str, List[Tuple[Tuple[int, ...], torch.Tensor]]]:
    """Every state entry as (offsets, tensor) pieces: the whole tensor at the origin, each library's ShardedTensors
    gathered by rectoolkit's full_state_dict (a collective: every rank calls this alike)."""
    return {key: [((0,) * value.dim(), value.detach().clone())] for key, value in full_state_dict(dmp).items()}


def assert_state_close(rank: int, where: str, ours: Dict, theirs: Dict) -> None:
    """TorchRec's pieces equal the same slices of rectoolkit's tensors (whole ones, from local_slices)."""
    for key, pieces in theirs.items():
        (_, full), = ours[key]
        for offsets, piece in pieces:
            expected = full[tuple(slice(o, o + s) for o, s in zip(offsets, piece.shape))]
            torch.testing.assert_close(expected, piece, msg=lambda m: f"rank {rank} {where} {key} {offsets}: {m}")


def max_difference(ours: Dict, other: Dict) -> float:
    return max(float((a[0][1] - b[0][1]).abs().max()) for a, b in zip(ours.values(), other.values()))


def semi_sync_vs_torchrec_worker(rank: int, W: int, settings: List[Tuple[int, bool, bool, bool]], steps: int) -> None:
    """For each (start_batch, stash_gradients, execute_all_batches, sequences), on an EmbeddingBagCollection (or
    with sequences=True an EmbeddingCollection): TorchRec's TrainPipelineSemiSync and
    rectoolkit's train on the same batches: as many batches, the same loss at every step, the same weights at the
    end (each rank's TorchRec shards against rectoolkit's tables). Semi-sync from a start_batch before the last
    batch differs from the plain loop (the test can tell a pipeline that is not stale); from after it, it is the
    plain loop bit for bit."""
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync as TheirSemiSync
    import torchrec

    from rectoolkit.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync as OurSemiSync

    run_cpu_shims()
    for start_batch, stash, execute_all, sequences in settings:
        weights = unsharded_weights(sequences)
        where = f"sequences={sequences} start_batch={start_batch} stash_gradients={stash} execute_all_batches={execute_all}"
        results = {}
        for lib, pipeline_class in ((torchrec, TheirSemiSync), (rtk, OurSemiSync)):
            dmp, optimizer = build(lib, W, weights, sequences)
            pipeline = pipeline_class(dmp, optimizer, torch.device("cpu"), start_batch=start_batch,
                                      stash_gradients=stash, execute_all_batches=execute_all)
            losses = train(pipeline, batches(lib, rank, steps))
            results[lib.__name__] = (losses, local_slices(dmp))
        (their_losses, theirs), (our_losses, ours) = results["torchrec"], results["rectoolkit"]
        assert len(our_losses) == len(their_losses) == steps, (rank, where, len(our_losses), len(their_losses))
        torch.testing.assert_close(torch.stack(our_losses), torch.stack(their_losses),
                                   msg=lambda m: f"rank {rank} {where} losses: {m}")
        assert_state_close(rank, where, ours, theirs)
        dmp, optimizer = build(rtk, W, weights, sequences)
        plain_losses = plain_loop(dmp, optimizer, batches(rtk, rank, steps))
        plain = local_slices(dmp)
        if start_batch < steps - 1:
            assert max_difference(ours, plain) > 1e-3, f"rank {rank} {where}: semi-sync gave the plain loop's weights"
        else:
            assert all(torch.equal(a, b) for a, b in zip(our_losses, plain_losses)), f"rank {rank} {where}: losses"
            assert max_difference(ours, plain) == 0, f"rank {rank} {where}: not the plain loop's weights"
