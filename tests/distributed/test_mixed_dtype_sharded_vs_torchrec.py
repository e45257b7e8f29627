"""Sharding a collection that mixes FP32 and FP16 tables, on 2 gloo ranks: every shard keeps its table's dtype
(FP16 tables in float16), the outputs stay float32, and a step of fused SGD moves the shards as TorchRec 1.8's
sharded collection moves its own (same plan, weights and batches); with plain gradients the shards' gradients are
the unsharded mixed collection's. memory_bytes() counts 2 bytes per FP16 weight, as the planner's estimate does.
"""

from __future__ import annotations

import pytest
import torch

from rectoolkit.distributed import full_state_dict

from dist_harness import run_workers

torchrec = pytest.importorskip("torchrec")

# name, rows, dim, FP16?, sharding (rank-wise placement for 2 ranks)
TABLES = [("t0", 6, 4, False, "table_wise"), ("t1", 7, 4, True, "row_wise"), ("t2", 8, 8, True, "column_wise"),
          ("t3", 5, 4, False, "data_parallel"), ("t4", 5, 4, True, "data_parallel"), ("t5", 9, 4, True, "table_wise")]


def _collection(lib):
    from importlib import import_module

    DataType = import_module("torchrec.types" if lib.__name__ == "torchrec" else "rectoolkit.modules.embedding_configs"
                             ).DataType
    torch.manual_seed(0)
    return lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"],
                               data_type=DataType.FP16 if fp16 else DataType.FP32)
        for i, (name, rows, dim, fp16, _) in enumerate(TABLES)], device=torch.device("cpu"))


def _plan(sp, ebc, world_size):
    kinds = {"table_wise": lambda i: sp.table_wise(rank=i % world_size, compute_kernel="fused"),
             "row_wise": lambda i: sp.row_wise(compute_kernel="fused"),
             "column_wise": lambda i: sp.column_wise(ranks=[0, 1], compute_kernel="fused"),
             "data_parallel": lambda i: sp.data_parallel()}
    return sp.construct_module_sharding_plan(ebc, {name: kinds[kind](i) for i, (name, _, _, _, kind) in enumerate(TABLES)},
                                             world_size=world_size, device_type="cpu")


def _batches(rank, count):
    generator = torch.Generator().manual_seed(11 + rank)
    out = []
    for _ in range(count):
        lengths = torch.randint(0, 4, (2 * len(TABLES),), generator=generator)
        values = torch.cat([torch.randint(0, rows, (int(lengths[2 * i:2 * i + 2].sum()),), generator=generator)
                            for i, (_, rows, _, _, _) in enumerate(TABLES)])
        out.append((values, lengths))
    return out


def _kjt(lib, values, lengths):
    return lib.KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(len(TABLES))], values=values,
                                                   lengths=lengths)


def _local_slices(sharded_tensor):
    return [(s.metadata.shard_offsets, s.metadata.shard_sizes, s.tensor) for s in sharded_tensor.local_shards()]


def fused_sgd_worker(rank: int, world_size: int) -> None:
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import model_parallel as their_mp
    from torchrec.distributed import sharding_plan as their_sp
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TheirSharder

    import rectoolkit as rtk
    from rectoolkit.distributed import model_parallel as our_mp
    from rectoolkit.distributed import sharding_plan as our_sp
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder as OurSharder

    def build(lib, mp, sp, sharder, optimizer, **options):
        model = torch.nn.Module()
        model.ebc = _collection(lib)
        fused = {"optimizer": optimizer, "learning_rate": 0.5, **options}
        return mp.DistributedModelParallel(model, device=torch.device("cpu"),
                                           plan=mp.ShardingPlan({"ebc": _plan(sp, model.ebc, world_size)}),
                                           sharders=[sharder(fused_params=fused)])

    ours = build(rtk, our_mp, our_sp, OurSharder, "exact_sgd")
    # (TorchRec rounds FP16 updates stochastically by default; rectoolkit's round to nearest, TorchRec's False)
    theirs = build(torchrec, their_mp, their_sp, TheirSharder, EmbOptimType.EXACT_SGD, stochastic_rounding=False)
    our_state = full_state_dict(ours)
    for name, _, _, fp16, _ in TABLES:  # whole tables in their own dtype, as TorchRec's state_dict has them
        assert our_state[f"ebc.embedding_bags.{name}.weight"].dtype == (torch.float16 if fp16 else torch.float32)
    with torch.no_grad():  # TorchRec's DMP initializes its shards afresh: give it rectoolkit's tables
        for key, value in our_state.items():
            their_value = theirs.state_dict()[key]
            for offsets, sizes, local in _local_slices(their_value) if hasattr(their_value, "local_shards") \
                    else [((0,) * value.dim(), value.shape, their_value)]:
                local.copy_(value[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))])
    # the fused optimizer's keys, one param group per sharding type and dtype, as TorchRec's (the DATA_PARALLEL
    # replicas have the dense kernel in both: in neither)
    assert sorted(ours.fused_optimizer.params) == sorted(theirs.fused_optimizer.params)
    assert len(ours.fused_optimizer.param_groups) == len(theirs.fused_optimizer.param_groups)
    # every shard this rank holds is in its table's dtype
    fp16_tables = {name for name, _, _, fp16, _ in TABLES if fp16}
    collection = ours.sharded_modules["ebc"]
    for table, _, weight, _ in collection.local_shards():
        assert weight.dtype == (torch.float16 if table in fp16_tables else torch.float32), (table, weight.dtype)
    # (no dense optimizer steps here: the DATA_PARALLEL replicas keep their weights in both, as TorchRec's do)
    for step, (values, lengths) in enumerate(_batches(rank, 2)):
        outputs = []
        for lib, dmp in ((rtk, ours), (torchrec, theirs)):
            # (TorchRec's sharded output lists the keys by sharding type: compared key by key)
            out = dmp.module.ebc(_kjt(lib, values, lengths)).wait().to_dict()
            loss = sum((value * torch.arange(float(value.numel())).view_as(value).div(10 * (k + 1))).sum()
                       for k, (key, value) in enumerate(sorted(out.items())))
            loss.backward()
            outputs.append({key: value.detach() for key, value in out.items()})
        assert all(value.dtype == torch.float32 for value in outputs[0].values())
        torch.testing.assert_close(outputs[0], outputs[1], atol=2e-3, rtol=2e-3)
    dist.barrier()
    our_state = full_state_dict(ours)
    for key, their_value in theirs.state_dict().items():
        replica = not hasattr(their_value, "local_shards")  # a DATA_PARALLEL replica: a plain tensor in TorchRec's
        for offsets, sizes, local in [((0, 0), their_value.shape, their_value)] if replica else _local_slices(their_value):
            expected = our_state[key][tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
            assert expected.dtype == local.dtype, (key, expected.dtype, local.dtype)
            torch.testing.assert_close(expected, local, atol=3e-3, rtol=3e-3,
                                       msg=lambda m: f"rank {rank} {key} {offsets}: {m}")


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(240)
def test_fused_sgd_on_mixed_dtypes_matches_torchrec():
    run_workers(fused_sgd_worker, 2)


def dense_gradient_worker(rank: int, world_size: int) -> None:
    """Plain gradients (no optimizer): each shard's gradient is the same slice of the unsharded mixed collection's
    gradient over both ranks' batches (divided by the world size, as TorchRec divides), in the table's dtype."""
    import torch.distributed as dist

    import rectoolkit as rtk
    from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
    from rectoolkit.distributed import sharding_plan as our_sp

    reference = _collection(rtk)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = shard_embedding_bag_collection(reference, _plan(our_sp, reference, world_size), env)
    batches = [_batches(r, 1)[0] for r in range(world_size)]
    out = sharded(_kjt(rtk, *batches[rank])).wait().values()
    expected = reference(_kjt(rtk, *batches[rank])).values()
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)
    assert out.dtype == torch.float32
    weights = torch.arange(float(out.numel())).view_as(out) / out.numel()
    (out * weights).sum().backward()
    for r, batch in enumerate(batches):  # the reference sees every rank's batch, each loss divided by W
        ((reference(_kjt(rtk, *batch)).values() * weights) / world_size).sum().backward()
    fp16 = {name for name, _, _, half, _ in TABLES if half}
    held = 0
    for table, shard, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard.rows, shard.columns
        full = reference.embedding_bags[table].weight
        assert weight.dtype == full.dtype == (torch.float16 if table in fp16 else torch.float32)
        torch.testing.assert_close(weight.detach(), full.detach()[r0:r1, c0:c1])
        torch.testing.assert_close(weight.grad.float(), full.grad.float()[r0:r1, c0:c1], atol=2e-3, rtol=2e-3,
                                   msg=lambda m: f"rank {rank} {table} {shard.rows} {shard.columns}: {m}")
        held += (r1 - r0) * (c1 - c0) * (2 if table in fp16 else 4)
    assert sharded.memory_bytes()["weights"] == held  # by hand: 2 bytes per FP16 value, 4 per FP32 value
    # the planner's estimate of this rank's weight bytes is exact for mixed dtypes too
    from rectoolkit.plan.types import ShardingPlan
    from rectoolkit.planner import Topology
    from rectoolkit.planner.cost import CostModel
    from rectoolkit.planner.measure import estimate_plan
    from rectoolkit.planner.tables import collect_tables

    estimate = estimate_plan(CostModel(Topology(world_size=world_size, compute_device="cpu"), "sgd"),
                             ShardingPlan({"": _plan(our_sp, reference, world_size)}),
                             collect_tables(reference.embedding_bag_configs(), 2))
    assert int(estimate["est_memory_weights_bytes"][rank]) == held


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_dense_gradients_on_mixed_dtypes_match_the_unsharded_collection():
    run_workers(dense_gradient_worker, 2)


def test_a_sharded_mixed_embedding_collection_keeps_each_tables_dtype():
    """The sequence collection on one rank: rows, gradients and dtypes as the unsharded mixed EmbeddingCollection's."""
    import rectoolkit as rtk
    from rectoolkit.distributed import ShardingEnv, shard_embedding_collection
    from rectoolkit.distributed import sharding_plan as our_sp
    from rectoolkit.modules.embedding_configs import DataType

    torch.manual_seed(0)
    reference = rtk.EmbeddingCollection(tables=[
        rtk.EmbeddingConfig(name=f"t{i}", num_embeddings=5 + i, embedding_dim=4, feature_names=[f"f{i}"],
                            data_type=DataType.FP16 if i % 2 else DataType.FP32) for i in range(4)])
    kinds = [our_sp.table_wise(rank=0), our_sp.row_wise(), our_sp.column_wise(ranks=[0, 0]), our_sp.data_parallel()]
    plan = our_sp.construct_module_sharding_plan(reference, {f"t{i}": kind for i, kind in enumerate(kinds)},
                                                 world_size=1, device_type="cpu")
    sharded = shard_embedding_collection(reference, plan, ShardingEnv.local())
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=[f"f{i}" for i in range(4)], values=torch.tensor(
        [0, 1, 1, 2, 3, 4, 0, 5, 2, 3]), lengths=torch.tensor([2, 1, 1, 2, 1, 1, 2, 0]))
    out, expected = sharded(kjt).wait(), reference(kjt)
    loss, reference_loss = 0, 0
    for k, key in enumerate(expected):
        assert out[key].values().dtype == torch.float32
        torch.testing.assert_close(out[key].values(), expected[key].values())
        loss = loss + out[key].values().sum() * (k + 1)
        reference_loss = reference_loss + expected[key].values().sum() * (k + 1)
    loss.backward()
    reference_loss.backward()
    for table, shard, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard.rows, shard.columns
        full = reference.embeddings[table].weight
        assert weight.dtype == full.dtype == (torch.float16 if table in ("t1", "t3") else torch.float32), table
        torch.testing.assert_close(weight.grad, full.grad[r0:r1, c0:c1])
