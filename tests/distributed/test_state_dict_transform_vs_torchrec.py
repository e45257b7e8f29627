"""rectoolkit.inference.state_dict_transform beside TorchRec 1.8's torchrec.inference.state_dict_transform, on 2 gloo
ranks: a trained sharded model's state_dict gathered into an unsharded model's (each library's DMP state_dict, both
with a ShardedTensor per sharded table, by each library's function), every rank's keys, and a state_dict moved to a
device."""

from __future__ import annotations

import pytest
import torch

from dist_harness import load_torchrec_shards, run_workers

torchrec = pytest.importorskip("torchrec")

ROWS = [6, 7, 8]


def _model(lib):
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=4, feature_names=[f"f{i}"])
        for i, rows in enumerate(ROWS)], device=torch.device("cpu"))
    model.dense = torch.nn.Linear(4, 2)
    return model


def _dmp(lib_name, weights, world_size):
    if lib_name == "torchrec":
        from torchrec.distributed import model_parallel as mp
        from torchrec.distributed import sharding_plan as sp
        lib = torchrec
    else:
        import rectoolkit as lib
        from rectoolkit.distributed import model_parallel as mp
        from rectoolkit.distributed import sharding_plan as sp
    model = _model(lib)
    fused = dict(compute_kernel="fused")
    plan = sp.construct_module_sharding_plan(model.ebc, {
        "t0": sp.table_wise(rank=1, **fused), "t1": sp.row_wise(**fused), "t2": sp.column_wise(ranks=[0, 1], **fused)},
        world_size=world_size, device_type="cpu")
    dmp = mp.DistributedModelParallel(model, device=torch.device("cpu"), plan=mp.ShardingPlan({"ebc": plan}),
                                      init_data_parallel=False)
    if lib_name == "torchrec":
        load_torchrec_shards(dmp.module.ebc, {k.split(".")[-2]: v for k, v in weights.items() if k.startswith("ebc.")})
    else:
        dmp.load_state_dict({k: v for k, v in weights.items() if k.startswith("ebc.")}, strict=False)
    with torch.no_grad():
        dmp.module.dense.weight.copy_(weights["dense.weight"])
        dmp.module.dense.bias.copy_(weights["dense.bias"])
    return dmp


def worker(rank: int, world_size: int) -> None:
    import torch.distributed as dist
    from torchrec.inference import state_dict_transform as theirs

    from rectoolkit.inference import state_dict_transform as ours

    pg = dist.group.WORLD
    weights = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(i))
               for i, (k, v) in enumerate(_model(__import__("rectoolkit")).state_dict().items())}
    sharded = {name: _dmp(name, weights, world_size).state_dict() for name in ("torchrec", "rectoolkit")}
    assert type(sharded["torchrec"]["ebc.embedding_bags.t1.weight"]).__name__ == "ShardedTensor"
    assert type(sharded["rectoolkit"]["ebc.embedding_bags.t1.weight"]).__name__ == "ShardedTensor"
    filled = {}
    for source in ("torchrec", "rectoolkit"):
        for module in (theirs, ours):
            dst = {k: torch.zeros_like(v) for k, v in weights.items()}
            module.state_dict_gather(sharded[source], dst)
            filled[(source, module.__name__.split(".")[0])] = dst
    for (source, gatherer), dst in filled.items():
        for key, value in weights.items():
            gathered_here = rank == 0 or key.startswith("dense.")
            expected = value if gathered_here else torch.zeros_like(value)  # ShardedTensors: to rank 0 only
            assert torch.equal(dst[key], expected), (rank, source, gatherer, key)
    # keys: each rank's own plus the others'
    mine = {f"rank{rank}.x": torch.zeros(1), "shared": torch.zeros(1)}
    assert ours.state_dict_all_gather_keys(mine, pg) == theirs.state_dict_all_gather_keys(mine, pg) == [
        "rank0.x", "rank1.x", "shared"]
    # to a device: plain tensors moved, ShardedTensors kept sharded with the same local shards
    for source in ("torchrec", "rectoolkit"):
        results = [module.state_dict_to_device(sharded[source], pg, torch.device("cpu")) for module in (theirs, ours)]
        assert list(results[0]) == list(results[1]) == sorted(sharded[source]), (rank, source)
        for key in results[0]:
            a, b = results[0][key], results[1][key]
            assert type(a) is type(b), (rank, source, key)
            if hasattr(a, "local_shards"):
                assert [(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in a.local_shards()] == \
                    [(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in b.local_shards()], (rank, key)
                assert all(torch.equal(x.tensor, y.tensor) for x, y in zip(a.local_shards(), b.local_shards()))
            else:
                assert torch.equal(a, b), (rank, source, key)
    with pytest.raises(KeyError, match=r"source state_dict has no \['missing'\]"):
        ours.state_dict_gather(sharded["rectoolkit"], {"missing": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"'dense.bias' is \[2\] in the source and \[3\] in the destination"):
        ours.state_dict_gather(sharded["rectoolkit"], {"dense.bias": torch.zeros(3)})


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_state_dict_transform_matches_torchrec():
    run_workers(worker, 2)
