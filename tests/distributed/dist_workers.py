"""Worker functions of the multi-process tests (importable by spawned processes).

Each worker checks many cases in one process group, so the suite pays the process start-up once. The
expected values come from the UNSHARDED collection run on the global batch (all ranks' samples), and the
expected bytes from rectoolkit.plan.traffic.step_traffic over the same batches.
"""

from __future__ import annotations

import json
from typing import Dict, List

import numpy as np
import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection, shard_embedding_collection
from rectoolkit.plan.traffic import COLLECTIVES, batch_id_counter, step_traffic
from rectoolkit.plan.types import ShardingType
from dist_harness import column_wise, data_parallel, global_batch, grid, make_batch, row_wise, table_wise

BATCH = 6
BAG_TABLES = [("t0", 40, 8, ["f0", "f0b"], "SUM"), ("t1", 30, 4, ["f1"], "MEAN"), ("t2", 21, 12, ["f2"], "SUM")]
SEQ_TABLES = [("e0", 40, 8, ["g0", "g0b"]), ("e1", 30, 8, ["g1"])]


def bag_tables():
    return [rtk.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=list(f), pooling=p)
            for n, r, d, f, p in BAG_TABLES]


def seq_tables():
    return [rtk.EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=list(f))
            for n, r, d, f in SEQ_TABLES]


def plan_for(case: str, tables, W: int, L: int) -> Dict[str, rtk.ParameterSharding]:
    """Hand-built plans by name; every table gets the named type (or a mix)."""
    def one(kind: str, t, i: int):
        R, D = t.num_embeddings, t.embedding_dim
        hosts = [list(range(h * L, (h + 1) * L)) for h in range(W // L)]
        if kind == "table_wise":
            return table_wise((i + 1) % W, R, D)
        if kind == "row_wise":
            return row_wise(list(range(W)), R, D)
        if kind == "column_wise":  # blocks of 4 columns, round robin (two blocks of t2 share a rank when W=2)
            return column_wise([((i + k) % W, 4) for k in range(D // 4)], R)
        if kind == "data_parallel":
            return data_parallel(W, R, D)
        if kind == "table_row_wise":
            return row_wise(hosts[i % len(hosts)], R, D, kind="table_row_wise")
        if kind == "grid_shard":
            return grid([(hosts[(i + k) % len(hosts)], 4) for k in range(D // 4)], R)
        if kind == "table_column_wise":  # blocks of 4 columns round robin over the ranks of one host
            host = hosts[i % len(hosts)]
            return column_wise([(host[(i + k) % L], 4) for k in range(D // 4)], R, kind="table_column_wise")
        raise ValueError(kind)

    mixes = {"mixed_a": ["row_wise", "data_parallel", "column_wise"],
             "mixed_b": ["table_row_wise", "table_column_wise", "grid_shard"],
             "mixed_c": ["grid_shard", "row_wise", "data_parallel"]}
    kinds = mixes.get(case, [case] * len(tables))
    return {t.name: one(kinds[i % len(kinds)], t, i) for i, t in enumerate(tables)}


def plan_keeping_replicas(case: str, tables, W: int, L: int, saved_case: str = "mixed_a") -> Dict:
    """plan_for(case), but the tables `saved_case` replicates stay DATA_PARALLEL: a checkpoint of a replica holds no
    fused optimizer state (its optimizer is the dense one, as TorchRec's), which a fused shard would need."""
    replicated = {t for t, ps in plan_for(saved_case, tables, W, L).items() if ps.sharding_type == "data_parallel"}
    replicas = plan_for("data_parallel", tables, W, L)
    return {name: replicas[name] if name in replicated else ps for name, ps in plan_for(case, tables, W, L).items()}


def dense_and_replicas(dmp) -> tuple:
    """dmp.dense_parameters() split: (the replicated dense layers, the DATA_PARALLEL replicas). A replica has the
    dense kernel, as TorchRec's: a test gives it a torch optimizer of its reference's fused rule."""
    shards = {id(p) for collection in dmp.sharded_modules.values() for p in collection.parameters()}
    plain = dmp.dense_parameters()
    return [p for p in plain if id(p) not in shards], [p for p in plain if id(p) in shards]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().abs().max()) if a.numel() else 0.0


def _bytes_match(env, plan, tables, W, L, batches, weighted, batch_sizes=None) -> bool:
    measured = env.gathered_bytes()
    batch_sizes = [b.stride() for b in batches] if batch_sizes is None else batch_sizes
    expected = step_traffic(plan, tables, W, L, batch_sizes, batch_id_counter(batches), is_weighted=weighted)
    for name in COLLECTIVES:
        got = measured.get(name, np.zeros((W, W), dtype=np.int64))
        if not np.array_equal(got, expected[name]):
            raise AssertionError(f"{name}: measured\n{got}\n!= expected\n{expected[name]}")
    return True


def batch_sizes_for(case: str, W: int) -> List[int]:
    """Equal local batches for the single-type cases; the mixed plans (which cover every type) run with
    a different batch size on every rank, as TorchRec's variable batch per rank."""
    return [BATCH + (r if case.startswith("mixed") else 0) for r in range(W)]


def equivalence_worker(rank: int, W: int, cases: List[tuple], result_file: str, device: str = "cpu") -> None:
    """(case, local_world_size) pairs; pooled and sequence collections: outputs, gradients (dense) or updated
    weights (fused Adagrad), bytes. The shards live on `device` (tests/gpu: "cuda:0", or "cuda:{rank}" for one GPU
    per rank), the reference on the CPU."""
    results = []
    for case, L in cases:
        for collection in ("ebc", "ec"):
            for optimizer in (None, "adagrad"):
                for weighted in ((False, True) if collection == "ebc" and optimizer is None else (False,)):
                    results.append(_check(rank, W, L, case, collection, optimizer, weighted,
                                          torch.device(device.format(rank=rank))))
    if rank == 0:
        with open(result_file, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")


def subgroup_equivalence_worker(rank: int, W: int, cases: List[tuple], result_file: str) -> None:
    """The world split into groups of 2 ranks (every rank makes every group); each group runs equivalence_worker's
    checks as a world of 2 on its own process group, at once with the others. Each group's first rank writes."""
    groups = [dist.new_group([first, first + 1]) for first in range(0, W, 2)]
    results = [_check(rank % 2, 2, L, case, collection, "adagrad" if collection == "ec" else None, False,
                      pg=groups[rank // 2]) for case, L in cases for collection in ("ebc", "ec")]
    if rank % 2 == 0:
        with open(result_file, "a") as f:
            for r in results:
                f.write(json.dumps({**r, "group": rank // 2}) + "\n")


def _check(rank, W, L, case, collection, optimizer, weighted, device=torch.device("cpu"), pg=None) -> dict:
    env = ShardingEnv.from_process_group(pg, local_world_size=L, device=device) if dist.is_initialized() \
        else ShardingEnv.local(device)
    tables = bag_tables() if collection == "ebc" else seq_tables()
    features = {f: t.num_embeddings for t in tables for f in t.feature_names}
    sizes = batch_sizes_for(case, W)
    batches = [make_batch(features, sizes[r], seed=100 * r + 7, weighted=weighted) for r in range(W)]
    opt = dict(optimizer=optimizer, lr=0.1) if optimizer else {}
    torch.manual_seed(0)
    if collection == "ebc":
        reference = rtk.EmbeddingBagCollection(tables, is_weighted=weighted, **opt)
        local = rtk.EmbeddingBagCollection(tables, is_weighted=weighted, **opt)
    else:
        reference = rtk.EmbeddingCollection(tables, **opt)
        local = rtk.EmbeddingCollection(tables, **opt)
    local.load_state_dict(reference.state_dict())
    # DATA_PARALLEL replicas keep plain gradients under a fused optimizer (TorchRec's dense kernel): compared with
    # the gradients of an unsharded collection without one
    plain = (rtk.EmbeddingBagCollection(tables, is_weighted=weighted) if collection == "ebc"
             else rtk.EmbeddingCollection(tables)) if optimizer else reference
    plain.load_state_dict(reference.state_dict())
    plan = plan_for(case, tables, W, L)
    shard = shard_embedding_bag_collection if collection == "ebc" else shard_embedding_collection
    sharded = shard(local, plan, env)
    env.stats.reset()

    # reference: the unsharded collection on the global batch, loss = sum(out * G) / W (the embedding gradients are
    # divided by the world size, as in TorchRec)
    g = torch.Generator().manual_seed(3)
    big = global_batch(batches)
    ref_out = reference(big)
    if collection == "ebc":
        ref_values = ref_out.values()
        grad_out = torch.randn(ref_values.shape, generator=g)
        ((ref_values * grad_out).sum() / W).backward()
        if plain is not reference:
            ((plain(big).values() * grad_out).sum() / W).backward()
        mine = slice(sum(sizes[:rank]), sum(sizes[:rank + 1]))
        out = sharded(batches[rank].to(device)).values()
        assert out.device == device, f"rank {rank}: output on {out.device}, shards on {device}"
        out_diff = _max_diff(out.cpu(), ref_values[mine].detach())
        (out * grad_out[mine].to(device)).sum().backward()
    else:
        out_diff, loss = 0.0, 0.0
        for name, jt in ref_out.items():
            weights = torch.randn(jt.values().shape, generator=g)
            loss = loss + (jt.values() * weights).sum()
            ref_out[name] = (jt, weights)
        (loss / W).backward()
        if plain is not reference:
            plain_out = plain(big)
            (sum((plain_out[name].values() * weights).sum() for name, (_, weights) in ref_out.items()) / W).backward()
        mine = sharded(batches[rank].to(device))
        local_loss = 0.0
        for name, jt in mine.items():
            ref_jt, weights = ref_out[name]
            start = sum(int(batches[r][name].lengths().sum()) for r in range(rank))
            n = jt.values().shape[0]
            assert jt.values().device == device, f"rank {rank}: {name} on {jt.values().device}, shards on {device}"
            assert torch.equal(jt.lengths().cpu(), batches[rank][name].lengths())
            out_diff = max(out_diff, _max_diff(jt.values().cpu(), ref_jt.values()[start:start + n].detach()))
            local_loss = local_loss + (jt.values() * weights[start:start + n].to(device)).sum()
        local_loss.backward()

    # gradients (dense) or weights after the fused update
    grad_diff = 0.0
    modules = reference.embedding_bags if collection == "ebc" else reference.embeddings
    plain_modules = plain.embedding_bags if collection == "ebc" else plain.embeddings
    for table, shard_md, weight, _ in sharded.local_shards():
        (r0, r1), (c0, c1) = shard_md.rows, shard_md.columns
        ref_weight = modules[table].weight
        assert weight.device == device, f"rank {rank}: shard of {table} on {weight.device}, expected {device}"
        replica = ShardingType.parse(plan[table].sharding_type) == ShardingType.DATA_PARALLEL
        if optimizer is None or replica:
            grad_diff = max(grad_diff, _max_diff(weight.grad.cpu(), plain_modules[table].weight.grad[r0:r1, c0:c1]))
        else:
            grad_diff = max(grad_diff, _max_diff(weight.detach().cpu(), ref_weight.detach()[r0:r1, c0:c1]))
    _bytes_match(env, plan, tables, W, L, batches, weighted)
    tolerance = 1e-5
    where = f"rank {rank}, case {case}, batch sizes {sizes}, {collection}, optimizer={optimizer}, weighted={weighted}"
    assert out_diff <= tolerance, f"{where}: outputs differ by {out_diff}"
    assert grad_diff <= tolerance, f"{where}: gradients/updated weights differ by {grad_diff}"
    return {"world_size": W, "local_world_size": L, "case": case, "batch_sizes": sizes, "collection": collection,
            "optimizer": optimizer or "dense", "weighted": weighted, "max_output_diff": out_diff,
            "max_grad_or_weight_diff": grad_diff, "bytes_equal_traffic_py": True}
