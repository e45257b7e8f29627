"""Worker of the sharded VBE test (importable by spawned processes): a batch size per feature, sharded vs unsharded.

The expected values come from the UNSHARDED EmbeddingBagCollection (itself checked against TorchRec 1.8 in
tests/modules/test_variable_batch_vs_torchrec.py) run on every rank's VBE batch, and the expected bytes from
rectoolkit.plan.traffic.step_traffic over the same batches, and for the one-level types (TABLE_WISE, COLUMN_WISE,
ROW_WISE) also from a hand count: every feature's pooled rows come back at the feature's own batch size.
With a fused SGD (fbgemm's kernel where installed), the one-level types' shards after one step equal the unsharded
weights minus lr times the unsharded gradient.
"""

from __future__ import annotations

import json
from typing import List

import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
from rectoolkit.plan.traffic import batch_sizes_of
from rectoolkit.plan.types import ShardingType
from dist_workers import _bytes_match, _max_diff, bag_tables, plan_for


def vbe_batch(features: dict, rank: int, seed: int, weighted: bool) -> rtk.KeyedJaggedTensor:
    """Feature k has 1 + (k + rank) % 4 samples on this rank (f0 one "user", f2 several "items"); the full batch
    has 5 + rank samples, each reading one sample of every feature through the inverse indices."""
    g = torch.Generator().manual_seed(seed)
    keys = list(features)
    strides = [1 + (k + rank) % 4 for k in range(len(keys))]
    lengths = torch.randint(0, 4, (sum(strides),), generator=g)
    per_key = lengths.split(strides)
    values = torch.cat([torch.randint(0, features[key], (int(per_key[k].sum()),), generator=g)
                        for k, key in enumerate(keys)])
    batch = 5 + rank
    inverse = torch.stack([torch.randint(0, s, (batch,), generator=g) for s in strides])
    return rtk.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths,
                                 weights=torch.rand(values.numel(), generator=g) if weighted else None,
                                 stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(keys, inverse))


def _pooled_bytes_by_hand(plan, tables, batches):
    """output_dist[owner][rank] = 4 * (rank's samples of f) * cols over the (shard, feature f) pairs of the owner,
    and what padding every feature to the rank's largest batch would send in all."""
    W = len(batches)
    expected = [[0] * W for _ in range(W)]
    padded = 0
    for table in tables:
        for shard in plan[table.name].shards:
            for feature in table.feature_names:
                for r, batch in enumerate(batches):
                    samples = dict(zip(batch.keys(), batch.stride_per_key()))
                    expected[shard.rank][r] += 4 * samples[feature] * shard.shard_sizes[1]
                    padded += 4 * max(samples.values()) * shard.shard_sizes[1]
    return expected, padded


def vbe_worker(rank: int, W: int, cases: List[tuple], result_file: str) -> None:
    """(case, local_world_size) pairs, unweighted and weighted."""
    results = []
    for case, L in cases:
        env = ShardingEnv.from_process_group(local_world_size=L) if dist.is_initialized() else ShardingEnv.local()
        for weighted in (False, True):
            results.append(_check(rank, W, L, env, case, weighted))
        if case in ("table_wise", "row_wise", "column_wise"):
            _check_fused_update(rank, W, L, env, case)
    if rank == 0:
        with open(result_file, "a") as f:
            for row in results:
                f.write(json.dumps(row) + "\n")


def _check_fused_update(rank: int, W: int, L: int, env: ShardingEnv, case: str, lr: float = 0.5) -> None:
    """The fused kernels (fbgemm's where installed) in VBE mode: after one step every shard equals the unsharded
    weights minus lr times the unsharded gradient over all ranks' batches (SGD)."""
    tables = bag_tables()
    features = {f: t.num_embeddings for t in tables for f in t.feature_names}
    batches = [vbe_batch(features, r, seed=100 * r + 17, weighted=False) for r in range(W)]
    torch.manual_seed(0)
    reference = rtk.EmbeddingBagCollection(tables)
    g = torch.Generator().manual_seed(5)
    ref_outs = [reference(batch).values() for batch in batches]
    grads_out = [torch.randn(out.shape, generator=g) for out in ref_outs]
    sum((out * grad).sum() for out, grad in zip(ref_outs, grads_out)).backward()
    local = rtk.EmbeddingBagCollection(tables, optimizer="sgd", lr=lr)
    local.load_state_dict(reference.state_dict())
    sharded = shard_embedding_bag_collection(local, plan_for(case, tables, W, L), env)
    out = sharded(batches[rank]).values()
    (out * grads_out[rank]).sum().backward()
    for table, shard_md, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard_md.rows, shard_md.columns
        ref = reference.embedding_bags[table].weight
        expected = (ref - lr * ref.grad)[r0:r1, c0:c1]
        diff = _max_diff(weight, expected)
        assert diff <= 1e-5, f"rank {rank}, {case}, fused SGD: table {table} rows {r0}:{r1} differ by {diff}"


def _check(rank: int, W: int, L: int, env: ShardingEnv, case: str, weighted: bool) -> dict:
    tables = bag_tables()
    features = {f: t.num_embeddings for t in tables for f in t.feature_names}
    batches = [vbe_batch(features, r, seed=100 * r + 11, weighted=weighted) for r in range(W)]
    torch.manual_seed(0)
    reference = rtk.EmbeddingBagCollection(tables, is_weighted=weighted)
    local = rtk.EmbeddingBagCollection(tables, is_weighted=weighted)
    local.load_state_dict(reference.state_dict())
    plan = plan_for(case, tables, W, L)
    sharded = shard_embedding_bag_collection(local, plan, env)
    env.stats.reset()

    # reference: every rank's batch through the unsharded collection, loss = sum over ranks of out_r * G_r
    g = torch.Generator().manual_seed(3)
    ref_outs = [reference(batch).values() for batch in batches]
    grads_out = [torch.randn(out.shape, generator=g) for out in ref_outs]
    sum((out * grad).sum() for out, grad in zip(ref_outs, grads_out)).backward()
    out = sharded(batches[rank]).values()
    assert out.shape == ref_outs[rank].shape, f"rank {rank}: output {list(out.shape)} != {list(ref_outs[rank].shape)}"
    out_diff = _max_diff(out, ref_outs[rank].detach())
    (out * grads_out[rank]).sum().backward()
    grad_diff = 0.0
    for table, shard_md, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard_md.rows, shard_md.columns
        grad_diff = max(grad_diff, _max_diff(weight.grad, reference.embedding_bags[table].weight.grad[r0:r1, c0:c1]))
    _bytes_match(env, plan, tables, W, L, batches, weighted, batch_sizes_of(batches))
    one_level = {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE}
    if all(ShardingType(ps.sharding_type) in one_level for ps in plan.values()):
        expected, padded = _pooled_bytes_by_hand(plan, tables, batches)
        measured = env.gathered_bytes()["output_dist"]
        assert (measured == expected).all(), f"rank {rank}, {case}: output_dist {measured.tolist()} != {expected}"
        assert measured.sum() < padded, f"rank {rank}, {case}: VBE sent {measured.sum()} bytes, padded {padded}"
    where = f"rank {rank}, case {case}, weighted={weighted}"
    assert out_diff <= 1e-5, f"{where}: outputs differ by {out_diff}"
    assert grad_diff <= 1e-5, f"{where}: gradients differ by {grad_diff}"
    return {"case": case, "weighted": weighted, "output_rows": [int(b.stride()) for b in batches],
            "padded_batch_sizes": batch_sizes_of(batches), "max_output_diff": out_diff, "max_grad_diff": grad_diff}
