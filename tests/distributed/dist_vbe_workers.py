"""Worker of the sharded VBE test (importable by spawned processes): a batch size per feature, sharded vs unsharded.

The expected values come from the UNSHARDED EmbeddingBagCollection (itself checked against TorchRec 1.8 in
tests/modules/test_variable_batch_vs_torchrec.py) run on every rank's VBE batch, and the expected bytes from
rectoolkit.plan.traffic.step_traffic over the same batches, and for every routed type also from a hand count: every
feature's pooled rows come back at the feature's own batch size (through both levels for TABLE_ROW_WISE and
GRID_SHARD). With a fused SGD (fbgemm's kernel where installed), the one-level types' shards after one step equal the
unsharded weights minus lr times the unsharded gradient.
"""

from __future__ import annotations

import json
from typing import List

import numpy as np
import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection, shard_embedding_collection
from rectoolkit.plan.torchrec_interop import to_torchrec
from rectoolkit.plan.traffic import batch_sizes_of
from rectoolkit.plan.types import ShardingType
from dist_harness import load_torchrec_shards, row_wise
from dist_workers import _bytes_match, _max_diff, bag_tables, plan_for, seq_tables


def vbe_batch(features: dict, rank: int, seed: int, weighted: bool, plain: bool = False) -> rtk.KeyedJaggedTensor:
    """Feature k has 1 + (k + rank) % 4 samples on this rank (f0 one "user", f2 several "items"); the full batch
    has 5 + rank samples, each reading one sample of every feature through the inverse indices. `plain`: a plain
    batch of 5 + rank samples of every feature instead."""
    g = torch.Generator().manual_seed(seed)
    keys = list(features)
    batch = 5 + rank
    strides = [batch if plain else 1 + (k + rank) % 4 for k in range(len(keys))]
    lengths = torch.randint(0, 4, (sum(strides),), generator=g)
    per_key = lengths.split(strides)
    values = torch.cat([torch.randint(0, features[key], (int(per_key[k].sum()),), generator=g)
                        for k, key in enumerate(keys)])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    if plain:
        return rtk.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights)
    inverse = torch.stack([torch.randint(0, s, (batch,), generator=g) for s in strides])
    return rtk.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights,
                                 stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(keys, inverse))


def _pooled_bytes_by_hand(plan, tables, batches, L):
    """The pooled output bytes by collective: output_dist[owner][rank] = 4 * (rank's samples of f) * cols over the
    (shard, feature f) pairs of the owner; for the two-level types the same blocks go to the rank's gateway on the
    owner's host (output_dist_intra), and each column block, reduced, from that gateway to the rank
    (output_dist_inter). Also what padding every feature to the rank's largest batch would send in all."""
    W = len(batches)
    expected = {name: np.zeros((W, W), dtype=np.int64) for name in ("output_dist", "output_dist_intra",
                                                                    "output_dist_inter")}
    padded = 0
    for table in tables:
        two_level = ShardingType(plan[table.name].sharding_type) in (ShardingType.TABLE_ROW_WISE,
                                                                     ShardingType.GRID_SHARD)
        column_blocks = {shard.columns: shard.rank // L for shard in plan[table.name].shards}
        for feature in table.feature_names:
            for r, batch in enumerate(batches):
                samples = dict(zip(batch.keys(), batch.stride_per_key()))
                for shard in plan[table.name].shards:
                    cols = shard.shard_sizes[1]
                    padded += 4 * max(samples.values()) * cols
                    if two_level:
                        expected["output_dist_intra"][shard.rank, (shard.rank // L) * L + r % L] += \
                            4 * samples[feature] * cols
                    else:
                        expected["output_dist"][shard.rank, r] += 4 * samples[feature] * cols
                for (c0, c1), host in column_blocks.items() if two_level else ():
                    padded += 4 * max(samples.values()) * (c1 - c0)
                    expected["output_dist_inter"][host * L + r % L, r] += 4 * samples[feature] * (c1 - c0)
    return expected, padded


def vbe_worker(rank: int, W: int, cases: List[tuple], result_file: str) -> None:
    """(case, local_world_size) pairs: the EmbeddingBagCollection unweighted and weighted; a case "ec:<plan>" the
    EmbeddingCollection (need_indices), also against TorchRec 1.8's sharded one where it runs that plan."""
    results = []
    for case, L in cases:
        env = ShardingEnv.from_process_group(local_world_size=L) if dist.is_initialized() else ShardingEnv.local()
        if case.startswith("ec:"):
            results.append(_check_ec(rank, W, L, env, case[len("ec:"):]))
            continue
        for weighted in (False, True):
            results.append(_check(rank, W, L, env, case, weighted))
        if case in ("table_wise", "row_wise", "column_wise"):
            _check_fused_update(rank, W, L, env, case)
    if rank == 0:
        with open(result_file, "a") as f:
            for row in results:
                f.write(json.dumps(row) + "\n")


def vbe_fused_worker(rank: int, W: int, cases: List[tuple], result_file: str) -> None:
    """(case, local_world_size) pairs, every one-level or two-level plan: the EmbeddingBagCollection unweighted and
    weighted (outputs, gradients, bytes), then one fused-SGD step (every shard equals the unsharded update); rank 0
    writes a row per check, the fused ones with their largest difference."""
    results = []
    for case, L in cases:
        env = ShardingEnv.from_process_group(local_world_size=L)
        results += [_check(rank, W, L, env, case, weighted) for weighted in (False, True)]
        results.append({"case": case, "fused_sgd_diff": _check_fused_update(rank, W, L, env, case)})
    if rank == 0:
        with open(result_file, "a") as f:
            for row in results:
                f.write(json.dumps(row) + "\n")


def _plan(case: str, tables, W: int, L: int) -> dict:
    """dist_workers.plan_for's plans, and "table_row_wise_last": every table in one row block on the last rank, so
    that the other ranks of its host are gateways that own nothing (they only add up and forward). A suffix
    "+plain" (see _collections) leaves the plan as it is."""
    case = case.removesuffix("+plain")
    if case == "table_row_wise_last":
        return {t.name: row_wise([W - 1], t.num_embeddings, t.embedding_dim, kind="table_row_wise") for t in tables}
    return plan_for(case, tables, W, L)


def _collections(W: int, L: int, env: ShardingEnv, case: str, tables, make, shard, seed: int, weighted: bool):
    """Every rank's VBE batch (a case "<plan>+plain": the last rank's plain), the unsharded reference `make()`, the
    same weights sharded by the case's plan."""
    features = {f: t.num_embeddings for t in tables for f in t.feature_names}
    batches = [vbe_batch(features, r, seed=100 * r + seed, weighted=weighted,
                         plain=case.endswith("+plain") and r == W - 1) for r in range(W)]
    torch.manual_seed(0)
    reference, local = make(), make()
    local.load_state_dict(reference.state_dict())
    plan = _plan(case, tables, W, L)
    sharded = shard(local, plan, env)
    env.stats.reset()
    return batches, reference, plan, sharded


def _shard_grad_diff(sharded, reference_tables) -> float:
    """The largest difference between each local shard's gradient and the reference table's slice."""
    diff = 0.0
    for table, shard_md, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard_md.rows, shard_md.columns
        diff = max(diff, _max_diff(weight.grad, reference_tables[table].weight.grad[r0:r1, c0:c1]))
    return diff
def vbe_reference_step(tables, W: int, seed: int, grad_seed: int, lr: float):
    """Every rank's VBE batch, the unsharded collection after backward of the mean over ranks of out_r * G_r (dense
    gradients), its outputs and the G_r, and a fused-SGD (lr) copy of its weights to shard."""
    features = {f: t.num_embeddings for t in tables for f in t.feature_names}
    batches = [vbe_batch(features, r, seed=100 * r + seed, weighted=False) for r in range(W)]
    torch.manual_seed(0)
    reference = rtk.EmbeddingBagCollection(tables)
    g = torch.Generator().manual_seed(grad_seed)
    ref_outs = [reference(batch).values() for batch in batches]
    grads_out = [torch.randn(out.shape, generator=g) for out in ref_outs]
    (sum((out * grad).sum() for out, grad in zip(ref_outs, grads_out)) / W).backward()
    local = rtk.EmbeddingBagCollection(tables, optimizer="sgd", lr=lr)
    local.load_state_dict(reference.state_dict())
    return batches, reference, ref_outs, grads_out, local


def fused_update_diffs(sharded, reference, lr: float) -> dict:
    """{(table, rows, columns): largest difference between the local shard (on any device) and the unsharded weights
    minus lr times their gradient}."""
    diffs = {}
    for table, shard_md, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard_md.rows, shard_md.columns
        ref = reference.embedding_bags[table].weight
        diffs[(table, shard_md.rows, shard_md.columns)] = _max_diff(weight.cpu(), (ref - lr * ref.grad)[r0:r1, c0:c1])
    return diffs


def _check_fused_update(rank: int, W: int, L: int, env: ShardingEnv, case: str, lr: float = 0.5) -> float:
    """The fused kernels (fbgemm's where installed) in VBE mode: after one step every shard equals the unsharded
    weights minus lr times the unsharded gradient over all ranks' batches (SGD). Returns the largest difference."""
    tables = bag_tables()
    batches, reference, _, grads_out, local = vbe_reference_step(tables, W, seed=17, grad_seed=5, lr=lr)
    sharded = shard_embedding_bag_collection(local, plan_for(case, tables, W, L), env)
    out = sharded(batches[rank]).values()
    (out * grads_out[rank]).sum().backward()
    diffs = fused_update_diffs(sharded, reference, lr)
    for (table, rows, _), diff in diffs.items():
        assert diff <= 1e-5, f"rank {rank}, {case}, fused SGD: table {table} rows {rows[0]}:{rows[1]} differ by {diff}"
    return max(diffs.values(), default=0.0)


def _check(rank: int, W: int, L: int, env: ShardingEnv, case: str, weighted: bool) -> dict:
    tables = bag_tables()
    batches, reference, plan, sharded = _collections(
        W, L, env, case, tables, lambda: rtk.EmbeddingBagCollection(tables, is_weighted=weighted),
        shard_embedding_bag_collection, 11, weighted)

    # reference: every rank's batch through the unsharded collection, loss = mean over ranks of out_r * G_r (the
    # embedding gradients are divided by W, as in TorchRec)
    g = torch.Generator().manual_seed(3)
    ref_outs = [reference(batch).values() for batch in batches]
    grads_out = [torch.randn(out.shape, generator=g) for out in ref_outs]
    (sum((out * grad).sum() for out, grad in zip(ref_outs, grads_out)) / W).backward()
    out = sharded(batches[rank]).values()
    assert out.shape == ref_outs[rank].shape, f"rank {rank}: output {list(out.shape)} != {list(ref_outs[rank].shape)}"
    out_diff = _max_diff(out, ref_outs[rank].detach())
    (out * grads_out[rank]).sum().backward()
    grad_diff = _shard_grad_diff(sharded, reference.embedding_bags)
    _bytes_match(env, plan, tables, W, L, batches, weighted, batch_sizes_of(batches))
    if all(ShardingType(ps.sharding_type) != ShardingType.DATA_PARALLEL for ps in plan.values()):
        expected, padded = _pooled_bytes_by_hand(plan, tables, batches, L)
        measured = env.gathered_bytes()
        sent = 0
        for name, matrix in expected.items():
            got = measured.get(name, np.zeros((W, W), dtype=np.int64))
            assert (got == matrix).all(), f"rank {rank}, {case}: {name} {got.tolist()} != {matrix.tolist()}"
            sent += int(got.sum())
        assert sent < padded, f"rank {rank}, {case}: VBE sent {sent} output bytes, padded {padded}"
    where = f"rank {rank}, case {case}, weighted={weighted}"
    assert out_diff <= 1e-5, f"{where}: outputs differ by {out_diff}"
    assert grad_diff <= 1e-5, f"{where}: gradients differ by {grad_diff}"
    return {"case": case, "weighted": weighted, "output_rows": [int(b.stride()) for b in batches],
            "padded_batch_sizes": batch_sizes_of(batches), "max_output_diff": out_diff, "max_grad_diff": grad_diff}


# ------------------------------------------------------------------------------------------------ EmbeddingCollection
# compared with TorchRec's sharded EmbeddingCollection (its sharder also offers DATA_PARALLEL, but TorchRec 1.8 does
# not build our hand plan's replica beside a fused row-wise table on CPU: checked by hand only, in mixed_a)
TORCHREC_EC_TYPES = {"table_wise", "row_wise", "column_wise"}


def _expanded_by_hand(outputs: dict, batch: rtk.KeyedJaggedTensor) -> dict:
    """{key: (lengths, rows, ids)} at the full batch, by a loop over its samples: sample b of feature f is the bag
    inverse[f][b] of the feature's own samples (`outputs`: the unsharded collection's, one bag per own sample)."""
    inverse = dict(zip(batch.inverse_indices()[0], batch.inverse_indices()[1].tolist()))
    expanded = {}
    for key, jt in outputs.items():
        lengths = jt.lengths().tolist()
        starts = [sum(lengths[:k]) for k in range(len(lengths))]
        bags = [slice(starts[k], starts[k] + lengths[k]) for k in inverse[key]]
        expanded[key] = ([lengths[k] for k in inverse[key]], torch.cat([jt.values()[bag] for bag in bags]),
                         torch.cat([jt.weights()[bag] for bag in bags]))
    return expanded


def _check_ec(rank: int, W: int, L: int, env: ShardingEnv, case: str) -> dict:
    """The sharded EmbeddingCollection on every rank's VBE batch: lengths, rows and ids expanded to the full batch
    equal the unsharded collection's expanded by hand and TorchRec's sharded collection's; gradients equal; bytes
    equal traffic.py's (the lengths travel padded to the rank's largest feature, as TorchRec pads them)."""
    tables = seq_tables()
    batches, reference, plan, sharded = _collections(
        W, L, env, case, tables, lambda: rtk.EmbeddingCollection(tables, need_indices=True),
        shard_embedding_collection, 7, False)

    expected = [_expanded_by_hand(reference(batch), batch) for batch in batches]
    g = torch.Generator().manual_seed(5)
    grads_out = [{key: torch.randn(rows.shape, generator=g) for key, (_, rows, _) in ref.items()} for ref in expected]
    (sum((rows * grads[key]).sum() for ref, grads in zip(expected, grads_out) for key, (_, rows, _) in ref.items())
     / W).backward()  # the mean over ranks: TorchRec divides the embedding gradients by the world size
    out = sharded(batches[rank]).wait()
    where = f"rank {rank}, EmbeddingCollection, case {case}"
    assert sorted(out) == sorted(expected[rank]), f"{where}: keys {sorted(out)}"
    out_diff = 0.0
    for key, (lengths, rows, ids) in expected[rank].items():
        assert out[key].lengths().tolist() == lengths, f"{where}, {key}: lengths {out[key].lengths().tolist()} != {lengths}"
        assert torch.equal(out[key].weights(), ids), f"{where}, {key}: ids differ"
        out_diff = max(out_diff, _max_diff(out[key].values(), rows.detach()))
    sum((out[key].values() * grads_out[rank][key]).sum() for key in out).backward()
    grad_diff = _shard_grad_diff(sharded, reference.embeddings)
    _bytes_match(env, plan, tables, W, L, batches, False, batch_sizes_of(batches))
    assert out_diff <= 1e-6, f"{where}: outputs differ by {out_diff}"
    assert grad_diff <= 1e-5, f"{where}: gradients differ by {grad_diff}"
    torchrec_diff = None
    if {ps.sharding_type for ps in plan.values()} <= TORCHREC_EC_TYPES:
        torchrec_diff = _torchrec_ec_diff(tables, reference, plan, batches[rank], out, where)
    return {"case": f"ec:{case}", "weighted": False, "output_rows": [int(b.stride()) for b in batches],
            "max_output_diff": out_diff, "max_grad_diff": grad_diff, "torchrec_diff": torchrec_diff}


def _torchrec_ec_diff(tables, reference, plan, batch, out, where: str) -> float:
    """TorchRec 1.8's sharded EmbeddingCollection under the same plan, weights and VBE batch: its lengths and ids
    must equal ours; returns the largest difference of the rows."""
    import torchrec
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv as TorchRecShardingEnv

    configs = [torchrec.EmbeddingConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                        feature_names=list(t.feature_names)) for t in tables]
    theirs = torchrec.EmbeddingCollection(tables=configs, need_indices=True, device=torch.device("cpu"))
    dmp = DistributedModelParallel(theirs, env=TorchRecShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=to_torchrec(rtk.ShardingPlan({"": plan})),
                                   sharders=[EmbeddingCollectionSharder()])
    load_torchrec_shards(dmp, {t.name: reference.embeddings[t.name].weight.detach() for t in tables})
    their_batch = torchrec.KeyedJaggedTensor(
        keys=batch.keys(), values=batch.values(), lengths=batch.lengths(),
        stride_per_key_per_rank=batch.stride_per_key_per_rank(), inverse_indices=batch.inverse_indices())
    with torch.no_grad():
        their_out = dmp(their_batch).wait()
    assert sorted(their_out) == sorted(out), f"{where}: TorchRec's keys {sorted(their_out)}, ours {sorted(out)}"
    diff = 0.0
    for key, jt in their_out.items():
        assert jt.lengths().tolist() == out[key].lengths().tolist(), f"{where}, {key}: lengths differ from TorchRec's"
        assert torch.equal(jt.weights(), out[key].weights()), f"{where}, {key}: ids differ from TorchRec's"
        diff = max(diff, _max_diff(jt.values(), out[key].values().detach()))
    assert diff <= 1e-6, f"{where}: rows differ from TorchRec's by {diff}"
    return diff
