"""A plan written with TorchRec's sharding_plan generators runs in DistributedModelParallel: 2 gloo ranks, every
generator in one plan (with both default kernels, dense and fused), pooled outputs equal to the unsharded
collection's on the global batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.optim import _apply_optimizer_in_backward

import rectoolkit as rtk
from dist_harness import global_batch, make_batch, run_workers
from dist_workers import bag_tables


def _model(fused: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.ebc = rtk.EmbeddingBagCollection(bag_tables())
    if fused:
        _apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.1})
    return model


def sharding_plan_worker(rank: int, world_size: int) -> None:
    from rectoolkit.distributed.model_parallel import DistributedModelParallel
    from rectoolkit.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, data_parallel,
                                                      row_wise, table_wise)
    from rectoolkit.distributed.types import ShardingPlan

    features = {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}
    batches = [make_batch(features, 5, seed=11 + r) for r in range(world_size)]
    for fused, per_table in ((False, {"t0": row_wise(), "t1": table_wise(rank=1), "t2": data_parallel()}),
                             (True, {"t0": column_wise(ranks=[1, 0]), "t1": row_wise(), "t2": table_wise(rank=0)})):
        reference = _model(fused).ebc(global_batch(batches)).values()
        model = _model(fused)
        module_plan = construct_module_sharding_plan(model.ebc, per_table, local_size=world_size, device_type="cpu")
        assert {ps.compute_kernel for table, ps in module_plan.items() if table != "t2" or fused} == \
            {"fused" if fused else "dense"}
        dmp = DistributedModelParallel(model, plan=ShardingPlan({"ebc": module_plan}))
        mine = dmp.module.ebc(batches[rank]).wait().values()
        expected = reference[5 * rank:5 * (rank + 1)]
        assert torch.allclose(mine, expected, atol=1e-5), (fused, rank, (mine - expected).abs().max())


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_a_constructed_plan_runs_in_dmp():
    run_workers(sharding_plan_worker, 2)
