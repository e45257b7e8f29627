"""TorchRec's `torchrec.distributed.shard.shard` on rectoolkit: one collection sharded by one generator for every
table, by a dict of generators and ParameterShardings, or by a module plan; on 2 gloo ranks the sharded outputs equal
TorchRec 1.8's `shard` given the same weights and batches, and its module plan is TorchRec's."""

from __future__ import annotations

import pytest
import torch

from dist_harness import run_workers

TABLES = [("t0", 10, 4), ("t1", 7, 8), ("t2", 12, 4)]


def _ebc(lib):
    torch.manual_seed(0)
    return lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"])
        for i, (name, rows, dim) in enumerate(TABLES)], device=torch.device("cpu"))


def _plans(sp, ebc):
    yield "one generator", sp.row_wise()
    yield "generators and a ParameterSharding", {
        "t0": sp.table_wise(rank=1), "t1": sp.column_wise(ranks=[0, 1]),
        "t2": sp.construct_module_sharding_plan(ebc, {"t0": sp.table_wise(rank=0), "t1": sp.table_wise(rank=0),
                                                      "t2": sp.row_wise()}, world_size=2, local_size=2,
                                                device_type="cpu")["t2"]}
    yield "a module plan", sp.construct_module_sharding_plan(
        ebc, {"t0": sp.table_row_wise(host_index=0), "t1": sp.table_wise(rank=0), "t2": sp.column_wise(ranks=[1])},
        world_size=2, local_size=2, device_type="cpu")


def shard_worker(rank: int, world_size: int) -> None:
    import torchrec
    from torchrec.distributed import sharding_plan as their_sp
    from torchrec.distributed.shard import shard as their_shard

    import rectoolkit as rtk
    from rectoolkit.distributed import sharding_plan as our_sp
    from rectoolkit.distributed.shard import shard as our_shard

    generator = torch.Generator().manual_seed(rank)
    lengths = torch.randint(0, 3, (3 * len(TABLES),), generator=generator)
    values = torch.cat([torch.randint(0, rows, (int(lengths[3 * i:3 * i + 3].sum()),), generator=generator)
                        for i, (_, rows, _) in enumerate(TABLES)])
    for (label, our_plan), (_, their_plan) in zip(_plans(our_sp, _ebc(rtk)), _plans(their_sp, _ebc(torchrec))):
        ours = our_shard(_ebc(rtk), our_plan, device=torch.device("cpu"))
        theirs = their_shard(_ebc(torchrec), their_plan, device=torch.device("cpu"))
        assert type(ours).__name__ == type(theirs).__name__ == "ShardedEmbeddingBagCollection", label
        for name in ("t0", "t1", "t2"):  # the plans the generators made, as TorchRec's made them
            mine, reference = ours.module_plan[name], theirs.module_sharding_plan[name]
            assert mine.sharding_type == reference.sharding_type and mine.ranks == reference.ranks, (label, name)
            assert [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in mine.sharding_spec.shards] == \
                [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in reference.sharding_spec.shards]
        full = _ebc(rtk).state_dict()
        with torch.no_grad():  # TorchRec's shards initialize afresh: give them the collection's weights
            for key, their_value in theirs.state_dict().items():
                for local in their_value.local_shards():
                    offsets, sizes = local.metadata.shard_offsets, local.metadata.shard_sizes
                    local.tensor.copy_(full[key][offsets[0]:offsets[0] + sizes[0], offsets[1]:offsets[1] + sizes[1]])
        our_out = ours(rtk.KeyedJaggedTensor.from_lengths_sync([f"f{i}" for i in range(3)], values, lengths)).wait()
        their_out = theirs(torchrec.KeyedJaggedTensor.from_lengths_sync([f"f{i}" for i in range(3)], values,
                                                                        lengths)).wait()
        torch.testing.assert_close(our_out.to_dict(), their_out.to_dict(), msg=lambda m: f"{label}: {m}")
        unsharded = _ebc(rtk)(rtk.KeyedJaggedTensor.from_lengths_sync([f"f{i}" for i in range(3)], values, lengths))
        torch.testing.assert_close(our_out.to_dict(), unsharded.to_dict())


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_shard_takes_torchrecs_plans_and_shards_as_torchrecs():
    pytest.importorskip("torchrec")
    run_workers(shard_worker, 2)


def test_shard_refuses_what_it_cannot_read():
    import rectoolkit as rtk
    from rectoolkit.distributed import ShardingEnv
    from rectoolkit.distributed import sharding_plan as sp
    from rectoolkit.distributed.shard import shard

    with pytest.raises(ValueError, match=r"the plan names \['nope'\], which are not tables of the "
                                         r"EmbeddingBagCollection \(tables: \['t0', 't1', 't2'\]\)"):
        shard(_ebc(rtk), {"nope": sp.row_wise()}, env=ShardingEnv.local())
    with pytest.raises(TypeError, match="plan must be a ModuleShardingPlan"):
        shard(_ebc(rtk), ["row_wise"], env=ShardingEnv.local())
    with pytest.raises(ValueError, match="no default sharder for a Linear"):
        shard(torch.nn.Linear(2, 2), sp.row_wise(), env=ShardingEnv.local())
    one_rank = shard(_ebc(rtk), sp.table_wise(rank=0), env=ShardingEnv.local())
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1", "f2"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1]))
    torch.testing.assert_close(one_rank(kjt).wait().values(), _ebc(rtk)(kjt).values())
