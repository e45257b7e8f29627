"""A DistributedModelParallel holding sharded managed collisions through torch.distributed.checkpoint (DCP), on 2
gloo ranks: each rank holds the managed-collision state of its own row blocks, which `dmp.state_dict()` gives as
ShardedTensors (TorchRec's), so `dcp.save` keeps every rank's blocks (as plain tensors under one key DCP kept rank
0's and loaded it on both ranks: rank 1's slots were lost, and its ids remapped as if it had seen rank 0's).

A model trained for four steps (every table's eviction interval ends there: the ids a table has seen since its
last update are not state, in TorchRec's either) is saved; a fresh model loads it under the same plan and under one with the row
blocks on the other ranks (DCP reshards). From then on each must remap every id and compute every output as the
trained model does on the same batches (evictions included), and its per-row state must be the trained state's.
"""

from __future__ import annotations

import os

import pytest
import torch

from dist_harness import make_batch, row_wise, run_workers
from dist_mc_workers import TABLES, MCModel


def _dmp(ranks, W):
    """The model on W ranks, its row blocks on `ranks` in order, sharded by TorchRec's spelling of the sharders
    (the embedding collection's sharder with row-wise Adagrad, and a ManagedCollisionCollectionSharder)."""
    from rectoolkit.distributed import DistributedModelParallel
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from rectoolkit.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
    from rectoolkit.distributed.mc_modules import ManagedCollisionCollectionSharder
    from rectoolkit.plan.types import ShardingPlan

    plan = ShardingPlan({"mc": {t: row_wise(ranks, rows, 4) for t, (rows, *_rest) in TABLES.items()}})
    sharder = ManagedCollisionEmbeddingBagCollectionSharder(
        EmbeddingBagCollectionSharder(fused_params={"optimizer": "row_wise_adagrad", "learning_rate": 0.1}),
        ManagedCollisionCollectionSharder())
    torch.manual_seed(0)
    return DistributedModelParallel(MCModel(True), plan=plan, local_world_size=W, sharders=[sharder])


def _optimizer_state(dmp):
    return {(key, name): value for key, states in dmp.fused_optimizer.state_dict()["state"].items()
            for name, value in states.items()}


def _row_state(dmp, sharded=None):
    """{key: the whole per-row state}, put together from every rank's blocks (all_gather_object, no DCP); of the
    model's state_dict, or of `sharded` ({key: ShardedTensor})."""
    import torch.distributed as dist

    sharded = dmp.state_dict() if sharded is None else sharded
    mine = {k: [(s.metadata.shard_offsets[0], s.tensor.clone()) for s in v.local_shards()]
            for k, v in sharded.items() if hasattr(v, "local_shards")}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    whole = {}
    for pieces in gathered:
        for key, blocks in pieces.items():
            for start, tensor in blocks:
                whole.setdefault(key, {})[start] = tensor
    return {key: torch.cat([blocks[s] for s in sorted(blocks)]) for key, blocks in whole.items()}


def dcp_worker(rank: int, W: int, out_dir: str) -> None:
    import torch.distributed.checkpoint as dcp

    features = {f: id_range for _, features, id_range, *_rest in TABLES.values() for f in features}
    trained = _dmp(list(range(W)), W)
    for step in range(4):  # (4: every table has just updated its slots; ids seen since are not state, as TorchRec's)
        out, _ = trained(make_batch(features, 5, seed=100 * step + rank))
        out.sum().backward()  # (trains the tables: row-wise Adagrad's state)
    state = {**trained.state_dict(), "optim": trained.fused_optimizer.state_dict()}
    per_row = [k for k, v in trained.state_dict().items() if type(v).__name__ == "ShardedTensor"]
    assert {k.rsplit(".", 1)[1] for k in per_row} == {  # (the tables' weights too, as TorchRec's)
        "weight", "_mch_sorted_raw_ids", "_mch_remapped_ids_mapping", "_mch_counts", "_mch_last_access_iter"}, per_row
    dcp.save(state, checkpoint_id=os.path.join(out_dir, "ckpt"))
    expected_rows = _row_state(trained)
    assert all(len(v) == TABLES[k.split(".")[3]][0] for k, v in expected_rows.items()), expected_rows
    expected_optimizer = _row_state(None, _optimizer_state(trained))
    assert len(expected_optimizer) == 2 and all(v.abs().sum() > 0 for v in expected_optimizer.values())

    restored = {"same plan": _dmp(list(range(W)), W), "blocks on the other ranks": _dmp(list(reversed(range(W))), W)}
    for where, dmp in restored.items():
        loading = {**dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
        dcp.load(loading, checkpoint_id=os.path.join(out_dir, "ckpt"))
        dmp.fused_optimizer.load_state_dict(loading.pop("optim"))
        dmp.load_state_dict(loading)
        rows = _row_state(dmp)
        for key, value in expected_rows.items():
            assert torch.equal(rows[key], value), (rank, where, key, rows[key], value)
        optimizer_rows = _row_state(None, _optimizer_state(dmp))
        for key, value in expected_optimizer.items():
            assert torch.equal(optimizer_rows[key], value), (rank, where, key)
    for step in range(4, 8):  # the same batches: the same remapping (evictions too) and outputs
        batch = make_batch(features, 5, seed=100 * step + rank)
        out, remapped = trained(batch)
        for where, dmp in restored.items():
            their_out, their_remapped = dmp(batch)
            assert torch.equal(their_remapped.values(), remapped.values()), (rank, step, where)
            torch.testing.assert_close(their_out, out, msg=lambda m: f"rank {rank} step {step} {where}: {m}")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_managed_collision_state_through_dcp_keeps_every_rank_blocks(tmp_path):
    run_workers(dcp_worker, 2, str(tmp_path))
