"""DistributedModelParallel and checkpoints.

2 ranks: DMP equals the unsharded model over 2 training steps (fused Adagrad for the tables, SGD for the
dense part, tolerance 1e-5), state_dict has the unsharded names and shapes, load_state_dict round-trips
bit for bit, memory per rank matches the plan, and a checkpoint saved under one plan loads bit-identically
under another. Then, in this process, the same checkpoint loads under world size 1 (resharding).
(Interrupted and corrupted checkpoints: test_checkpoint_faults.py.)
"""

from __future__ import annotations

import warnings

import pytest
import torch

from rectoolkit.distributed import full_state_dict

import rectoolkit
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv, load_checkpoint, save_checkpoint
from rectoolkit.distributed.checkpoint import load_saved_shards
from rectoolkit.plan.types import ShardingPlan
from dist_dmp_workers import PATH, TinyModel, dmp_worker, unsharded_collection_worker
from dist_harness import run_workers
from dist_workers import bag_tables, plan_for, plan_keeping_replicas


def global_optimizer_state(checkpoint_dir) -> dict:
    """(table, state name) -> global tensor, assembled from a checkpoint's shard files (2-D states)."""
    out = {}
    for entry in load_saved_shards(checkpoint_dir):
        (r0, c0), (rows, cols) = entry["offsets"], entry["sizes"]
        for name, tensor in entry["optimizer"].items():
            if tensor.dim() == 2:
                full = out.setdefault((entry["table"], name), torch.full((200, 200), float("nan")))
                full[r0:r0 + rows, c0:c0 + cols] = tensor
    return out


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_dmp_and_resharding_checkpoint(tmp_path):
    checkpoint_dir = tmp_path / "ckpt"
    reference_file = tmp_path / "reference.pt"
    run_workers(dmp_worker, 2, 2, str(checkpoint_dir), str(reference_file))
    reference = torch.load(reference_file)

    # world size 1, a third plan (every table row-wise on the one rank, but those plan A replicated: their optimizer
    # state is the dense optimizer's, not in the shards, as TorchRec's DATA_PARALLEL): same bits
    model = DistributedModelParallel(TinyModel(), env=ShardingEnv.local(),
                                     plan=ShardingPlan({PATH: plan_keeping_replicas("row_wise", bag_tables(), 1, 1)}))
    load_checkpoint(model, checkpoint_dir)
    state = full_state_dict(model)
    assert list(state) == list(reference)
    assert all(torch.equal(state[k], v) for k, v in reference.items())

    # the optimizer state survives the resharding too
    again = tmp_path / "again"
    save_checkpoint(model, again)
    before, after = global_optimizer_state(checkpoint_dir), global_optimizer_state(again)
    assert before.keys() == after.keys() and before
    for key in before:
        assert torch.equal(before[key].nan_to_num(), after[key].nan_to_num()), key


def test_plan_of_bare_tables_on_a_model_leaves_it_unsharded_and_names_the_path_and_the_fix():
    """TorchRec leaves a collection the plan has no entry for unsharded; here a warning also says why."""
    plan = ShardingPlan({"": plan_for("row_wise", bag_tables(), 1, 1)})
    with pytest.warns(UserWarning, match=rf"no entry for the collection\(s\) at \['{PATH}'\].*planner.plan\(model\)"):
        dmp = DistributedModelParallel(TinyModel(), env=ShardingEnv.local(), plan=plan)
    assert type(dmp.module.sparse.ebc) is rectoolkit.EmbeddingBagCollection  # unsharded, a replica on every rank


def test_only_the_collections_with_a_sharder_are_sharded_as_in_torchrec():
    from rectoolkit.distributed.sharders import EmbeddingCollectionSharder

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a collection without a sharder is left unsharded without a warning
        dmp = DistributedModelParallel(TinyModel(), env=ShardingEnv.local(), sharders=[EmbeddingCollectionSharder()])
    assert type(dmp.module.sparse.ebc) is rectoolkit.EmbeddingBagCollection and dmp.plan.plan == {}
    torch.manual_seed(0)
    reference = TinyModel()
    dmp.module.load_state_dict(reference.state_dict())
    dense, kjt = torch.randn(2, 3), rectoolkit.KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f0b", "f1", "f2"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
        lengths=torch.tensor([1, 0, 2, 1, 0, 1, 0, 1]))
    assert torch.equal(dmp(dense, kjt), reference(dense, kjt))


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_an_unsharded_collection_is_a_replica_trained_by_ddp_on_two_ranks():
    run_workers(unsharded_collection_worker, 2)
