"""A batch size per feature (VBE) vs the same batch expanded, through the sharded EmbeddingBagCollection.

    .venv/bin/python benchmarks/bench_vbe.py [--workload dlrm26|dlrm26_in_order|uniform20k] [--users U] [candidates ...]
                                             # prints a markdown table and writes benchmarks/results/vbe_<workload>.md

Ranking-style batch on each of 2 local CPU ranks (gloo, 1 torch thread each): U users (default 1), each with C
candidates (B = U C samples per rank). Half the features are user features, which carry one sample per user; the
other half item features, one sample per candidate. Workloads: `dlrm26` (default; the issue's case): the 26
tables of ../shared/workloads/dlrm26.json (rows 3 to 1,000,000, dim 64), ids per bag 1 + Poisson(pf - 1) and ids
Zipf(1.05) as the workload file says; its five multi-hot features (pooling factor 20: histories, the features a
ranking batch repeats per candidate) and the first eight one-hot ones in Criteo's order are the user features,
the other 13 one-hot features the item features; `dlrm26_in_order`: the same tables with cat_0..cat_12 as the
user features and cat_13..cat_25 as the item features (Criteo's order: two multi-hot features on the item side,
so more of the batch is per candidate); `uniform20k`: 26 tables of 20k rows x 64, 13 user features with 1..13
ids per bag and 13 item features with 1, uniform ids. Fused SGD; row-wise or table-wise. "expanded" sends every user feature once per
candidate (a plain KJT of B samples per feature); "VBE" sends it once per user with inverse indices: its ids,
lengths and pooled rows cross the all-to-alls at each feature's own batch size, the owner's kernel runs each
feature at its own batch size (the kernels' variable-batch mode), and the collection expands the small pooled
blocks straight into the output. RECTOOLKIT_DISABLE_FBGEMM=1 runs the pure-torch kernels. Both outputs are
checked equal before timing. Input bytes = ids + lengths (+ the per-rank batch-size message) of input_dist,
summed over ranks, per step; output bytes = pooled rows forward + their gradients backward. Step = forward +
backward (fused update) on the slower rank: median of 10 steps after 3 warm-up steps, in 3 rounds that alternate
expanded and VBE; the table gives the median over rounds and [min, max], and the speed-up per round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
from rectoolkit.kernels import fbgemm_available
from rectoolkit.train.data import bag_lengths, zipf_ids
from rectoolkit.workloads import load_workload

HERE = Path(__file__).resolve().parent
WARMUP, STEPS, ROUNDS = 3, 10, 3
OUTPUT_COLLECTIVES = ("output_dist", "output_dist_backward")
WORKLOADS = ("dlrm26", "dlrm26_in_order", "uniform20k")


def workload(name: str) -> Tuple[List[rtk.EmbeddingBagConfig], List[float], int, float]:
    """(tables, one feature each: user features first, then item; the pooling factor of each; the number of
    user features; the Zipf alpha of the ids, 0 = uniform)."""
    if name in ("dlrm26", "dlrm26_in_order"):
        w = load_workload("dlrm26")  # (the copy of ../shared/workloads/dlrm26.json in the package)
        factor = {t.name: w.pooling_factors[t.feature_names[0]] for t in w.tables}
        if name == "dlrm26":  # the multi-hot features (histories) and the first one-hot ones on the user side
            multi = [t for t in w.tables if factor[t.name] > 1]
            one_hot = [t for t in w.tables if factor[t.name] <= 1]
            tables = multi + one_hot  # the first 13 are the user features
        else:
            tables = list(w.tables)
        return tables, [factor[t.name] for t in tables], 13, float(w.id_distribution.get("alpha", 0.0))
    if name == "uniform20k":
        tables = [rtk.EmbeddingBagConfig(name=f"t_{kind}{i}", num_embeddings=20_000, embedding_dim=64,
                                         feature_names=[f"{kind}{i}"]) for kind in ("user", "item") for i in range(13)]
        return tables, [float(i + 1) for i in range(13)] + [1.0] * 13, 13, 0.0
    raise ValueError(f"unknown workload {name!r}: use one of {WORKLOADS}")


def plan(tables: List[rtk.EmbeddingBagConfig], kind: str, world_size: int) -> dict:
    out = {}
    for i, t in enumerate(tables):
        rows, dim = t.num_embeddings, t.embedding_dim
        if kind == "table_wise":
            rank = i % world_size
            out[t.name] = rtk.ParameterSharding("table_wise", ranks=[rank],
                                                shards=[rtk.ShardMetadata.on_rank(rank, 0, 0, rows, dim)])
        else:
            bounds = [rows * r // world_size for r in range(world_size + 1)]
            out[t.name] = rtk.ParameterSharding("row_wise", ranks=list(range(world_size)), shards=[
                rtk.ShardMetadata.on_rank(r, bounds[r], 0, bounds[r + 1] - bounds[r], dim) for r in range(world_size)])
    return out


def batches(name: str, users: int, candidates: int, seed: int):
    """(VBE KJT, the same batch expanded to B = users * candidates samples per feature)."""
    tables, factors, num_user, alpha = workload(name)
    g = torch.Generator().manual_seed(seed)
    batch = users * candidates
    keys = [t.feature_names[0] for t in tables]
    user_of_sample = torch.arange(users).repeat_interleave(candidates)
    vbe_lengths, vbe_values, full_lengths, full_values = [], [], [], []
    for f, (t, factor) in enumerate(zip(tables, factors)):
        own = users if f < num_user else batch  # a user feature: one bag per user; an item feature: per candidate
        if name == "uniform20k":
            lengths = torch.full((own,), int(factor))
        else:
            lengths = bag_lengths(own, factor, g)
        ids = zipf_ids(int(lengths.sum()), t.num_embeddings, alpha, g, salt=f) if alpha else \
            torch.randint(0, t.num_embeddings, (int(lengths.sum()),), generator=g)
        vbe_lengths.append(lengths)
        vbe_values.append(ids)
        if f < num_user:  # expand: every candidate repeats its user's bag
            bags = list(ids.split(lengths.tolist()))
            full_lengths.append(lengths[user_of_sample])
            full_values.append(torch.cat([bags[u] for u in user_of_sample.tolist()]))
        else:
            full_lengths.append(lengths)
            full_values.append(ids)
    strides = [users] * num_user + [batch] * (len(tables) - num_user)
    inverse = torch.stack([user_of_sample] * num_user + [torch.arange(batch)] * (len(tables) - num_user))
    vbe = rtk.KeyedJaggedTensor(keys=keys, values=torch.cat(vbe_values), lengths=torch.cat(vbe_lengths),
                                stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(keys, inverse))
    full = rtk.KeyedJaggedTensor(keys=keys, values=torch.cat(full_values), lengths=torch.cat(full_lengths))
    return vbe, full


def worker(rank: int, world_size: int, init_file: str, workload_name: str, users: int, cases: list, result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    env = ShardingEnv.from_process_group(local_world_size=world_size)
    rows = []
    for kind, candidates in cases:
        torch.manual_seed(0)
        tables = workload(workload_name)[0]
        ebc = rtk.EmbeddingBagCollection(tables, optimizer="sgd", lr=0.0)
        sharded = shard_embedding_bag_collection(ebc, plan(tables, kind, world_size), env)
        del ebc  # (the unsharded tables: up to 1.4 GB)
        vbe, full = batches(workload_name, users, candidates, seed=rank)
        with torch.no_grad():
            assert torch.allclose(sharded(vbe).values(), sharded(full).values(), atol=1e-5), "outputs differ"
        step_ms = {"expanded": [], "VBE": []}
        sent_bytes = {}
        for _ in range(ROUNDS):
            for name, kjt in (("expanded", full), ("VBE", vbe)):
                times = []
                for step in range(WARMUP + STEPS):
                    env.stats.reset()
                    dist.barrier()
                    started = time.perf_counter()
                    sharded(kjt).values().sum().backward()
                    times.append(time.perf_counter() - started)
                sent = env.gathered_bytes()
                sent_bytes[name] = [int(sum(sent[n].sum() for n in sent if n in names))
                                    for names in (("input_dist", "metadata"), OUTPUT_COLLECTIVES)]
                slowest = torch.tensor([statistics.median(times[WARMUP:]) * 1e3])
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                step_ms[name].append(float(slowest))
        for name in ("expanded", "VBE"):
            rows.append((kind, candidates, name, *sent_bytes[name], *step_ms[name]))
    if rank == 0:
        with open(result_file, "w") as f:
            for row in rows:
                f.write("\t".join(map(str, row)) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def spread(values: List[float], unit: str = "", digits: int = 1) -> str:
    """"median [min, max]" of the rounds."""
    return f"{statistics.median(values):.{digits}f}{unit} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="*", type=int, default=[64, 256, 512], help="candidates per user")
    parser.add_argument("--workload", choices=WORKLOADS, default="dlrm26")
    parser.add_argument("--users", type=int, default=1, help="users per rank")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    cases = [(kind, c) for kind in ("row_wise", "table_wise") for c in args.candidates]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "rows.tsv")
        mp.start_processes(worker, args=(2, os.path.join(tmp, "rendezvous"), args.workload, args.users, cases,
                                         result_file), nprocs=2, join=True, start_method="spawn")
        rows = [line.split("\t") for line in open(result_file).read().splitlines()]
    lines = ["# bench_vbe", "", __doc__.split("\n\n", 2)[2].strip().replace("\n", " "), "",
             f"Workload `{args.workload}`, {args.users} user(s) per rank; 2 ranks, 1 torch thread each; 1-minute load "
             f"average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (a 2-core machine shared with other "
             f"jobs); torch {torch.__version__}, kernel backend {'fbgemm' if fbgemm_available() else 'torch'}.", "",
             "| plan | candidates per user | batch | input bytes expanded | input bytes VBE | input ratio | "
             "output bytes expanded | output bytes VBE | output ratio | step ms expanded | step ms VBE | speed-up |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_case = {}
    for kind, c, name, input_bytes, output_bytes, *ms in rows:
        by_case.setdefault((kind, int(c)), {})[name] = (int(input_bytes), int(output_bytes), [float(m) for m in ms])
    for (kind, c), result in by_case.items():
        (full_in, full_out, full_ms), (vbe_in, vbe_out, vbe_ms) = result["expanded"], result["VBE"]
        speed_ups = [f / v for f, v in zip(full_ms, vbe_ms)]  # per round: the two ran side by side
        lines.append(f"| {kind} | {c} | {args.users * c} | {full_in:,} | {vbe_in:,} | {full_in / vbe_in:.1f}x | "
                     f"{full_out:,} | {vbe_out:,} | {full_out / vbe_out:.1f}x | {spread(full_ms)} | {spread(vbe_ms)} | "
                     f"{spread(speed_ups, 'x', 2)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        (HERE / "results" / f"vbe_{args.workload}.md").write_text(text)


if __name__ == "__main__":
    main()
