"""DistributedModelParallel's surface beside TorchRec 1.8's, on 2 gloo ranks: the same user script runs on both
libraries and what it sees must agree.

named_parameters / bare_named_parameters (the unsharded model's names, this rank's shards; TorchRec also lists an
empty placeholder for a table with no shard here, left out of the comparison), named_buffers (no sharded
bookkeeping), sparse_grad_parameter_names, in_backward_optimizer_filter over named_parameters, the fused
optimizer's keys, state_dict keys, load_state_dict's result, data_parallel_wrapper (a custom one is called with the
DMP, env and device; the default's DDP options), the `device` and `module` properties, env.process_group.
rectoolkit's state_dict holds whole tables (TorchRec: ShardedTensor), so it loads into a DMP with another plan;
TorchRec refuses that, so the round trip is checked against the unsharded collection instead.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from rectoolkit.distributed import full_state_dict
from torch import nn

from dist_harness import run_workers


def _model(lib) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=6 + i, embedding_dim=4, feature_names=[f"f{i}"])
        for i in range(3)], device=torch.device("cpu"))
    model.side = nn.EmbeddingBag(5, 3, sparse=True)
    model.dense = nn.EmbeddingBag(5, 3)
    model.lin = nn.Linear(4, 1)
    model.register_buffer("step", torch.zeros(2))
    return model


def _imports(lib_name: str):
    if lib_name == "torchrec":
        import torchrec as lib
        from torchrec.distributed import model_parallel, sharding_plan
        from torchrec.distributed.types import ShardingEnv, ShardingPlan
        from torchrec.optim.optimizers import in_backward_optimizer_filter
    else:
        import rectoolkit as lib
        from rectoolkit.distributed import model_parallel, sharding_plan
        from rectoolkit.distributed.types import ShardingEnv, ShardingPlan
        from rectoolkit.optim.optimizers import in_backward_optimizer_filter
    return lib, model_parallel, sharding_plan, ShardingEnv, ShardingPlan, in_backward_optimizer_filter


def surface_worker(rank: int, world_size: int, lib_name: str, out_dir: str) -> None:
    import torch.distributed as dist

    lib, model_parallel, sp, ShardingEnv, ShardingPlan, in_backward_optimizer_filter = _imports(lib_name)
    DMP = model_parallel.DistributedModelParallel

    class Recording(model_parallel.DataParallelWrapper):  # a user's own wrapper, written for TorchRec
        calls = []

        def wrap(self, dmp, env, device):
            self.calls.append((type(dmp).__name__, env.process_group is dist.group.WORLD, str(device)))

    model = _model(lib)
    module_plan = sp.construct_module_sharding_plan(
        model.ebc, {"t0": sp.table_wise(rank=1, compute_kernel="fused"), "t1": sp.row_wise(),
                    "t2": sp.column_wise(ranks=[0, 1])}, world_size=world_size, device_type="cpu")
    plan = ShardingPlan({"ebc": module_plan})
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    dmp = DMP(model, env=env, device=torch.device("cpu"), plan=plan, init_data_parallel=False,
              data_parallel_wrapper=Recording())
    dmp.init_data_parallel()
    dmp.init_data_parallel()  # again: nothing
    seen = {"wrapper_calls": Recording.calls, "still_unwrapped": dmp._dmp_wrapped_module is dmp.module,
            "device": str(dmp.device)}
    nonempty = [(name, list(p.shape)) for name, p in dmp.named_parameters() if p.numel()]
    seen["named_parameters"] = nonempty
    seen["bare_named_parameters"] = [(n, list(p.shape)) for n, p in dmp.bare_named_parameters() if p.numel()]
    seen["parameters_are_named"] = len([p for p in dmp.parameters() if p.numel()]) == len(nonempty)
    seen["named_buffers"] = [name for name, _ in dmp.named_buffers()]
    seen["sparse_grad"] = dmp.sparse_grad_parameter_names()
    seen["not_fused"] = [n for n, p in in_backward_optimizer_filter(dmp.named_parameters()) if p.numel()]
    seen["fused_optimizer"] = sorted(dmp.fused_optimizer.params)
    state = full_state_dict(dmp)
    seen["state_dict"] = sorted(state)
    seen["state_dict_shapes"] = {k: list(v.shape) for k, v in state.items()}
    result = dmp.load_state_dict(state)
    seen["load_result"] = [type(result).__name__, result.missing_keys, result.unexpected_keys]

    wrapped = DMP(_model(lib), env=env, device=torch.device("cpu"), plan=plan,
                  data_parallel_wrapper=model_parallel.DefaultDataParallelWrapper(
                      bucket_cap_mb=1, static_graph=False, find_unused_parameters=True))
    ddp = wrapped._dmp_wrapped_module
    seen["ddp"] = [type(ddp).__name__, ddp.static_graph, ddp.find_unused_parameters, ddp.bucket_bytes_cap,
                   ddp.broadcast_buffers, ddp.gradient_as_bucket_view]
    seen["default_ddp"] = [dmp.__class__(_model(lib), env=env, device=torch.device("cpu"), plan=plan)
                           ._dmp_wrapped_module.static_graph]
    with open(os.path.join(out_dir, f"{lib_name}_{rank}.json"), "w") as f:
        json.dump(seen, f)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_dmp_surface_matches_torchrec(tmp_path):
    pytest.importorskip("torchrec")
    for lib_name in ("torchrec", "rectoolkit"):
        run_workers(surface_worker, 2, lib_name, str(tmp_path))
    for rank in range(2):
        theirs = json.loads((tmp_path / f"torchrec_{rank}.json").read_text())
        ours = json.loads((tmp_path / f"rectoolkit_{rank}.json").read_text())
        for key in theirs:
            if key in ("named_parameters", "bare_named_parameters", "not_fused"):  # sharded entries in group order
                assert sorted(ours[key]) == sorted(theirs[key]), (rank, key)
            else:
                assert ours[key] == theirs[key], (rank, key)
    ours = json.loads((tmp_path / "rectoolkit_0.json").read_text())
    assert ours["named_parameters"][-1] == ["lin.bias", [1]] and ["ebc.embedding_bags.t1.weight", [4, 4]] in \
        ours["named_parameters"]  # hand-checked: rank 0 holds rows 0-3 of t1 (7 rows in blocks of 4)
    assert ours["sparse_grad"] == ["side.weight"]


def round_trip_worker(rank: int, world_size: int) -> None:
    import rectoolkit as rtk
    from rectoolkit.distributed.model_parallel import DistributedModelParallel
    from rectoolkit.distributed.sharding_plan import column_wise, construct_module_sharding_plan, row_wise, table_wise

    reference = _model(rtk)
    first = DistributedModelParallel(_model(rtk), plan=rtk.ShardingPlan({"ebc": construct_module_sharding_plan(
        reference.ebc, {"t0": table_wise(rank=1), "t1": row_wise(), "t2": column_wise(ranks=[0, 1])},
        world_size=world_size, device_type="cpu")}))
    blank = _model(rtk)
    with torch.no_grad():
        for param in blank.parameters():
            param.zero_()
    second = DistributedModelParallel(blank, plan=rtk.ShardingPlan({"ebc": construct_module_sharding_plan(
        reference.ebc, {"t0": row_wise(), "t1": column_wise(ranks=[1, 0]), "t2": table_wise(rank=0)},
        world_size=world_size, device_type="cpu")}))
    result = second.load_state_dict({"outer." + k: v for k, v in full_state_dict(first).items()}, prefix="outer.")
    assert result.missing_keys == [] and result.unexpected_keys == []
    for key, value in full_state_dict(second).items():
        assert torch.equal(value, reference.state_dict()[key]), key


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_state_dict_loads_into_a_dmp_with_another_plan():
    run_workers(round_trip_worker, 2)


def test_a_wrapper_without_wrap_and_an_unknown_precision_are_refused():
    import rectoolkit as rtk
    from rectoolkit.distributed import ShardingEnv
    from rectoolkit.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel

    with pytest.raises(TypeError, match="data_parallel_wrapper=.*has no wrap"):
        DistributedModelParallel(_model(rtk), env=ShardingEnv.local(), data_parallel_wrapper=object())
    with pytest.raises(ValueError, match="allreduce_comm_precision='fp8'"):
        DefaultDataParallelWrapper(allreduce_comm_precision="fp8")


def collective_plan_worker(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    import rectoolkit as rtk
    from rectoolkit.distributed.planner import EmbeddingShardingPlanner, Topology
    from rectoolkit.distributed.sharding_plan import get_default_sharders

    planner = EmbeddingShardingPlanner(Topology(world_size=world_size, compute_device="cpu"), batch_size=8)
    plan = planner.collective_plan(_model(rtk), get_default_sharders(), dist.group.WORLD)
    plans = [None] * world_size
    dist.all_gather_object(plans, str(plan))
    assert plans[0] == plans[1] and "ebc" in plan.plan
    assert (planner.last is None) == (rank != 0)  # TorchRec's way: rank 0 plans, the others receive its plan


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_collective_plan_is_rank_zeros_plan_on_every_rank():
    run_workers(collective_plan_worker, 2)


def _local_slices(sharded_tensor):
    """(offsets, sizes, tensor) of this rank's shards of a TorchRec ShardedTensor."""
    return [(s.metadata.shard_offsets, s.metadata.shard_sizes, s.tensor) for s in sharded_tensor.local_shards()]


def training_worker(rank: int, world_size: int) -> None:
    """Two training steps of a TorchRec DMP and of rectoolkit's, the same plan, weights and batches (fused row-wise
    Adagrad in backward): each rank's shards of TorchRec's tables equal the same slices of rectoolkit's tables.
    TorchRec divides the embedding gradients by the world size (comm_ops.GRADIENT_DIVISION); rectoolkit summed
    them, which moved every table by another step (2x the update with SGD)."""
    import torch.distributed as dist
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import model_parallel as their_mp
    from torchrec.distributed import sharding_plan as their_sp
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TheirSharder

    import rectoolkit as rtk
    from rectoolkit.distributed import model_parallel as our_mp
    from rectoolkit.distributed import sharding_plan as our_sp
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder as OurSharder

    def build(lib, mp, sp, sharder, optimizer):
        model = _model(lib)
        plan = sp.construct_module_sharding_plan(model.ebc, {
            "t0": sp.table_wise(rank=1, compute_kernel="fused"), "t1": sp.row_wise(compute_kernel="fused"),
            "t2": sp.column_wise(ranks=[1], compute_kernel="fused")}, world_size=world_size, device_type="cpu")
        fused = {"optimizer": optimizer, "learning_rate": 0.1, "eps": 0.01}
        return mp.DistributedModelParallel(model, device=torch.device("cpu"), plan=mp.ShardingPlan({"ebc": plan}),
                                           sharders=[sharder(fused_params=fused)])

    ours = build(rtk, our_mp, our_sp, OurSharder, "exact_row_wise_adagrad")
    theirs = build(torchrec, their_mp, their_sp, TheirSharder, EmbOptimType.EXACT_ROWWISE_ADAGRAD)
    with torch.no_grad():  # TorchRec's DMP initializes its shards afresh: give it rectoolkit's tables
        for key, value in full_state_dict(ours).items():
            their_value = theirs.state_dict()[key]
            for offsets, sizes, local in _local_slices(their_value) if hasattr(their_value, "local_shards") \
                    else [((0,) * value.dim(), value.shape, their_value)]:
                local.copy_(value[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))])
    generator = torch.Generator().manual_seed(7 + rank)
    for _ in range(2):
        lengths = torch.randint(0, 3, (3 * 2,), generator=generator)
        values = torch.cat([torch.randint(0, 6 + i, (int(lengths[2 * i:2 * i + 2].sum()),), generator=generator)
                            for i in range(3)])
        for lib, dmp in ((rtk, ours), (torchrec, theirs)):
            kjt = lib.KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1", "f2"], values=values, lengths=lengths)
            (dmp.module.ebc(kjt).wait().values() * torch.arange(12.0)).sum().backward()
    dist.barrier()
    our_state = full_state_dict(ours)
    for key, their_value in theirs.state_dict().items():
        if not key.startswith("ebc."):
            continue
        for offsets, sizes, local in _local_slices(their_value):
            expected = our_state[key][tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
            torch.testing.assert_close(expected, local, msg=lambda m: f"rank {rank} {key} {offsets}: {m}")
    their_opt = {k: sorted(v) for k, v in theirs.fused_optimizer.state_dict()["state"].items()}
    assert {k: sorted(v) for k, v in ours.fused_optimizer.state_dict()["state"].items()} == their_opt


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_two_training_steps_give_torchrecs_shards():
    pytest.importorskip("torchrec")
    run_workers(training_worker, 2)
