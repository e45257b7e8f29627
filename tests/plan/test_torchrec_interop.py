"""TorchRec interop against a real TorchRec: lossless round trips, same printout, DMP accepts our plans,
and plans made by TorchRec's planner read back into our reports."""

import os
import socket

import pytest
import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.serialization import validate_plan
from rectoolkit.plan.torchrec_interop import from_torchrec, to_torchrec
from rectoolkit.plan.types import ShardingType
from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

pytestmark = pytest.mark.torchrec

TYPES = [t.value for t in ShardingType]


def our_tables(n=len(TYPES)):
    return [EmbeddingBagConfig(name=f"t{i}", num_embeddings=100 + 37 * i, embedding_dim=32, feature_names=[f"f{i}"])
            for i in range(n)]


def every_type_plan(device="cuda", world_size=4, local=2):
    constraints = {f"t{i}": ParameterConstraints(sharding_types=[t], min_partition=16) for i, t in enumerate(TYPES)}
    topo = Topology(world_size=world_size, local_world_size=local, compute_device=device, batch_size=8)
    return EmbeddingShardingPlanner(topo, constraints=constraints).plan(our_tables())


def test_round_trip_is_lossless_and_prints_the_same():
    pytest.importorskip("torchrec")
    from torchrec.distributed.types import ShardingPlan as TorchRecPlan

    plan = every_type_plan()
    tr = to_torchrec(plan)
    assert isinstance(tr, TorchRecPlan)
    assert str(tr) == str(plan)  # TorchRec's own __str__ on the converted plan
    back = from_torchrec(tr, our_tables(), local_world_size=2)
    assert back == plan
    assert {ps.sharding_type for _, _, ps in back.items()} == set(TYPES)
    # and TorchRec -> ours -> TorchRec keeps every field TorchRec has
    again = to_torchrec(back)
    for path, name, _ in plan.items():
        a, b = tr.plan[path][name], again.plan[path][name]
        assert (a.sharding_type, a.compute_kernel, a.ranks) == (b.sharding_type, b.compute_kernel, b.ranks)
        assert (a.sharding_spec is None) == (b.sharding_spec is None)
        if a.sharding_spec is not None:
            assert [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in a.sharding_spec.shards] == \
                   [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in b.sharding_spec.shards]


def test_cache_load_factor_survives():
    pytest.importorskip("torchrec")
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=300 * 1024**2, batch_size=8)
    tables = [EmbeddingBagConfig(name="big", num_embeddings=2_000_000, embedding_dim=64, feature_names=["f"])]
    plan = EmbeddingShardingPlanner(topo, constraints={"big": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["fused_uvm_caching"], cache_load_factor=0.1)}).plan(tables)
    tr = to_torchrec(plan)
    assert tr.plan[""]["big"].cache_params.load_factor == 0.1
    assert from_torchrec(tr, tables) == plan


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(300)
def test_torchrec_dmp_accepts_our_plan_and_our_report_reads_torchrecs_plan():
    torchrec = pytest.importorskip("torchrec")
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner as TorchRecPlanner
    from torchrec.distributed.planner import Topology as TorchRecTopology
    from torchrec.distributed.types import ShardingEnv

    ours = our_tables(3)
    theirs = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                          feature_names=t.feature_names) for t in ours]
    constraints = {"t0": ParameterConstraints(sharding_types=["row_wise"]),
                   "t1": ParameterConstraints(sharding_types=["table_wise"]),
                   "t2": ParameterConstraints(sharding_types=["data_parallel"])}
    plan = EmbeddingShardingPlanner(Topology(world_size=1, compute_device="cpu", batch_size=4),
                                    constraints=constraints).plan(ours)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ebc = torchrec.EmbeddingBagCollection(tables=theirs, device=torch.device("meta"))
        dmp = DistributedModelParallel(module=ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                       device=torch.device("cpu"), plan=to_torchrec(plan),
                                       sharders=[EmbeddingBagCollectionSharder()])
        assert str(dmp.plan) == str(plan)
        kjt = torchrec.KeyedJaggedTensor(keys=["f0", "f1", "f2"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
                                         lengths=torch.ones(6, dtype=torch.int64))
        out = dmp(kjt)
        out = out.wait() if hasattr(out, "wait") else out
        assert out.values().shape == (2, 96)
    finally:
        dist.destroy_process_group()

    # a plan made by TorchRec's own planner, inspected with our report
    tr_topology = TorchRecTopology(world_size=2, compute_device="cpu")
    tr_plan = TorchRecPlanner(topology=tr_topology).plan(
        torchrec.EmbeddingBagCollection(tables=theirs, device=torch.device("meta")), [EmbeddingBagCollectionSharder()])
    imported = from_torchrec(tr_plan, ours)
    validate_plan(imported, ours, world_size=2)
    assert str(imported) == str(tr_plan)
    report = EmbeddingShardingPlanner(Topology(world_size=2, compute_device="cpu", batch_size=4)).report(imported, tables=ours)
    assert len(report.placement) >= 3 and report.summary["fits"]
