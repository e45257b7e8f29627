"""DATA_PARALLEL replicas keep their gradient buffer from step to step (zeroed in place) once nothing holds it, and
allocate a new one while anything still does: .grad accumulating, a gradient the caller kept.

One process (ShardingEnv.local()): the buffer's reuse does not depend on the all-reduce, which the multi-process
tests (test_data_parallel_dense_vs_torchrec.py) cover. Expected gradients come from an unsharded collection.
"""

from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from dist_harness import make_batch
from dist_workers import bag_tables


def data_parallel_plan():
    """t0 and t1 replicated (one gradient buffer for both), t2 table-wise with a fused optimizer."""
    plan = {}
    for t in bag_tables():
        shards = [ShardMetadata.on_rank(0, 0, 0, t.num_embeddings, t.embedding_dim)]
        plan[t.name] = (ParameterSharding("table_wise", "fused", ranks=[0], shards=shards) if t.name == "t2" else
                        ParameterSharding("data_parallel", "dense", ranks=[0], shards=shards))
    return plan


def collections():
    torch.manual_seed(0)
    reference = rtk.EmbeddingBagCollection(bag_tables())  # plain gradients
    module = rtk.EmbeddingBagCollection(bag_tables(), optimizer="sgd", lr=0.1)
    module.load_state_dict(reference.state_dict())
    sharded = shard_embedding_bag_collection(module, data_parallel_plan(), ShardingEnv.local())
    replicas = {table: weight for table, _, weight, _ in sharded.local_shards() if table in ("t0", "t1")}
    return reference, sharded, replicas


def features():
    return {f: t.num_embeddings for t in bag_tables() for f in t.feature_names}


def backward(collection, seed):
    collection(make_batch(features(), 6, seed=seed)).values().square().sum().backward()


def reference_grads(reference, seeds):
    """The unsharded replicas' gradients summed over the batches of `seeds`."""
    for weight in reference.parameters():
        weight.grad = None
    for seed in seeds:
        backward(reference, seed)
    return {table: reference.embedding_bags[table].weight.grad.clone() for table in ("t0", "t1")}


def test_the_buffer_is_reused_once_zero_grad_drops_it():
    reference, sharded, replicas = collections()
    backward(sharded, seed=1)
    first = StorageWeakRef(replicas["t0"].grad.untyped_storage())
    assert replicas["t0"].grad.untyped_storage().data_ptr() == replicas["t1"].grad.untyped_storage().data_ptr()
    for weight in replicas.values():
        weight.grad = None  # zero_grad(set_to_none=True)
    assert not first.expired(), "the gradient buffer was freed with .grad"
    backward(sharded, seed=2)
    assert StorageWeakRef(replicas["t0"].grad.untyped_storage()).cdata == first.cdata, "a new buffer was allocated"
    expected = reference_grads(reference, [2])
    for table, weight in replicas.items():
        torch.testing.assert_close(weight.grad, expected[table], msg=table)  # zeroed: nothing left of step 1


def test_a_buffer_still_held_is_never_overwritten():
    reference, sharded, replicas = collections()
    # .grad kept (zero_grad(set_to_none=False) or accumulation): the next backward adds to it
    backward(sharded, seed=1)
    backward(sharded, seed=2)
    expected = reference_grads(reference, [1, 2])
    for table, weight in replicas.items():
        torch.testing.assert_close(weight.grad, expected[table], msg=table)
    # a gradient the caller kept, .grad then dropped: it keeps its values through the next backward
    kept = replicas["t0"].grad
    before = kept.clone()
    for weight in replicas.values():
        weight.grad = None
    backward(sharded, seed=3)
    assert torch.equal(kept, before)
    expected = reference_grads(reference, [3])
    for table, weight in replicas.items():
        torch.testing.assert_close(weight.grad, expected[table], msg=table)
    # zero_grad(set_to_none=False): zeroed in place by the optimizer, accumulated into by the next backward
    optimizer = torch.optim.SGD(list(replicas.values()), lr=0.0)
    optimizer.zero_grad(set_to_none=False)
    backward(sharded, seed=4)
    expected = reference_grads(reference, [4])
    for table, weight in replicas.items():
        torch.testing.assert_close(weight.grad, expected[table], msg=table)
