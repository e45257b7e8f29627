"""DATA_PARALLEL's kernel and its no_sync, in one process (ShardingEnv.local()).

A DATA_PARALLEL entry runs the dense kernel only (TorchRec's sharders offer it no other; TorchRec 1.8's DMP fails
on a hand-written "fused" one deep in fbgemm): a plan entry edited to another kernel is refused by the sharded
collection and DistributedModelParallel, naming the table. Under the collection's no_sync() a replica's backward
records no dp_allreduce and leaves its local gradient in .grad; the next backward outside all-reduces the
accumulated gradient with its own. Two ranks: tests/distributed/test_data_parallel_dense_vs_torchrec.py.
Expected gradients come from an unsharded collection.
"""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import (DistributedModelParallel, ShardingEnv, shard_embedding_bag_collection,
                                    shard_embedding_collection)
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from dist_dmp_workers import PATH, TinyModel
from dist_harness import make_batch
from dist_workers import bag_tables, seq_tables


def replicated_plan(tables=None):
    return {t.name: ParameterSharding("data_parallel", ranks=[0], shards=[
        ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)]) for t in tables or bag_tables()}


def features():
    return {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}


@pytest.mark.parametrize("kernel", ["fused", "fused_uvm", "fused_uvm_caching", "quant"])
def test_an_edited_plan_entry_with_another_kernel_is_refused_naming_the_table(kernel):
    plan = replicated_plan()
    plan["t1"].compute_kernel = kernel  # built "dense", then edited (or read from TorchRec's plan objects)
    with pytest.raises(ValueError, match=rf"table 't1': a data_parallel table has compute_kernel '{kernel}'.*"
                                         r"use compute_kernel=\"dense\""):
        shard_embedding_bag_collection(rtk.EmbeddingBagCollection(bag_tables()), plan, ShardingEnv.local())


def test_distributed_model_parallel_refuses_it_naming_the_table():
    plan = {name: ParameterSharding("data_parallel", ranks=[0], shards=ps.shards)
            for name, ps in replicated_plan().items()}
    plan["t0"].compute_kernel = "fused"
    with pytest.raises(ValueError, match=r"table 't0': a data_parallel table has compute_kernel 'fused'"):
        DistributedModelParallel(TinyModel(), env=ShardingEnv.local(), plan=ShardingPlan({PATH: plan}))


def replicated_and_reference(collection=rtk.EmbeddingBagCollection, tables=bag_tables,
                             shard=shard_embedding_bag_collection):
    """(every table replicated on one rank, its env, an unsharded collection with the same weights)."""
    torch.manual_seed(0)
    reference = collection(tables())
    module = collection(tables())
    module.load_state_dict(reference.state_dict())
    env = ShardingEnv.local()
    return shard(module, replicated_plan(tables()), env), env, reference


def test_no_sync_skips_the_all_reduce_and_the_next_backward_reduces_the_accumulated_gradient():
    sharded, env, reference = replicated_and_reference()
    replicas = {name: weight for name, _, weight, _ in sharded.local_shards()}
    batches = [make_batch(features(), 4, seed=seed) for seed in (1, 2, 3)]
    calls = []
    for step, batch in enumerate(batches):
        env.stats.reset()
        weights = torch.arange(1.0, 1.0 + sum(t.embedding_dim * len(t.feature_names) for t in bag_tables()))
        if step < 2:
            with sharded.no_sync():
                out = sharded(batch).values()
        else:
            out = sharded(batch).values()
        (out * weights).sum().backward()
        (reference(batch).values() * weights).sum().backward()
        calls.append(env.stats.calls.get("dp_allreduce", 0))
        for name, replica in replicas.items():  # the local gradient accumulates in .grad, as under DDP's no_sync
            torch.testing.assert_close(replica.grad, reference.embedding_bags[name].weight.grad,
                                       msg=lambda m: f"step {step} table {name}: {m}")
    assert calls == [0, 0, 1]


def test_no_sync_restores_the_sync_of_each_group_and_leaves_other_types_alone():
    plan = replicated_plan()
    plan["t2"] = ParameterSharding("table_wise", ranks=[0], shards=plan["t2"].shards)
    sharded = shard_embedding_bag_collection(rtk.EmbeddingBagCollection(bag_tables()), plan, ShardingEnv.local())
    replicas = [g for g in sharded.groups.values() if g.sharding_type.value == "data_parallel"]
    assert len(replicas) == 1 and len(sharded.groups) == 2
    with pytest.raises(RuntimeError, match="inside"):
        with sharded.no_sync():
            assert [g.sync_gradients for g in replicas] == [False]
            raise RuntimeError("inside")
    assert [g.sync_gradients for g in replicas] == [True]


def test_reduce_accumulated_gradients_all_reduces_what_no_sync_left_once():
    sharded, env, reference = replicated_and_reference()
    batch = make_batch(features(), 4, seed=7)
    with sharded.no_sync():
        sharded(batch).values().square().sum().backward()
    reference(batch).values().square().sum().backward()
    calls = []
    for _ in range(2):  # the second finds nothing left to all-reduce
        env.stats.reset()
        sharded.reduce_accumulated_gradients()
        calls.append(env.stats.calls.get("dp_allreduce", 0))
    assert calls == [1, 0]
    for name, _, replica, _ in sharded.local_shards():
        torch.testing.assert_close(replica.grad, reference.embedding_bags[name].weight.grad)


def test_a_sequence_collections_replicas_honour_no_sync_too():
    sharded, env, reference = replicated_and_reference(rtk.EmbeddingCollection, seq_tables, shard_embedding_collection)
    batch = make_batch({f: t.num_embeddings for t in seq_tables() for f in t.feature_names}, 4, seed=5)
    with sharded.no_sync():
        out = sharded(batch)
    sum(out[f].values().square().sum() for f in out).backward()
    expected = reference(batch)
    sum(expected[f].values().square().sum() for f in expected).backward()
    assert "dp_allreduce" not in env.stats.calls
    for name, _, replica, _ in sharded.local_shards():
        torch.testing.assert_close(replica.grad, reference.embeddings[name].weight.grad)
