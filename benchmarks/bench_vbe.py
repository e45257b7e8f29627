"""A batch size per feature (VBE) vs the same batch expanded, through the sharded EmbeddingBagCollection.

    .venv/bin/python benchmarks/bench_vbe.py [candidates ...]   # prints a markdown table
                                                                # and writes benchmarks/results/vbe.md

Ranking-style batch on each of 2 local CPU ranks (gloo, 1 torch thread each): 2 users, each with C candidates
(B = 2 C samples). 13 user features (pooling factors 1..13) carry one sample per user; 13 item features (pooling
factor 1) one per candidate. 26 tables of 20k rows x 64 (fused SGD), row-wise or table-wise. "expanded" sends
every user feature once per candidate (a plain KJT of B samples per feature); "VBE" sends it once per user with
inverse indices; its ids, lengths and pooled rows cross the all-to-alls at each feature's own batch size, the
owner's kernel runs each feature at its own batch size (the kernels' variable-batch mode; fbgemm on CPU pads, see
rectoolkit/kernels/fbgemm_embedding.py), and the collection expands the small pooled blocks straight into the
output. RECTOOLKIT_DISABLE_FBGEMM=1 runs the pure-torch kernels. Both outputs are checked equal before timing.
Input bytes = ids + lengths (+ the per-rank batch-size message) of input_dist, summed over ranks, per step; output
bytes = pooled rows forward + their gradients backward. Step = forward + backward (fused update) on the slower
rank: median of 10 steps after 3 warm-up steps, in 3 rounds that alternate expanded and VBE; the table gives
the median over rounds and [min, max].
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
from rectoolkit.kernels import fbgemm_available

HERE = Path(__file__).resolve().parent
USERS, ROWS, DIM, FEATURES = 2, 20_000, 64, 13
WARMUP, STEPS, ROUNDS = 3, 10, 3
OUTPUT_COLLECTIVES = ("output_dist", "output_dist_backward")


def tables() -> List[rtk.EmbeddingBagConfig]:
    return [rtk.EmbeddingBagConfig(name=f"t_{kind}{i}", num_embeddings=ROWS, embedding_dim=DIM,
                                   feature_names=[f"{kind}{i}"]) for kind in ("user", "item") for i in range(FEATURES)]


def plan(kind: str, world_size: int) -> dict:
    out = {}
    for i, t in enumerate(tables()):
        if kind == "table_wise":
            rank = i % world_size
            out[t.name] = rtk.ParameterSharding("table_wise", ranks=[rank],
                                                shards=[rtk.ShardMetadata.on_rank(rank, 0, 0, ROWS, DIM)])
        else:
            block = ROWS // world_size
            out[t.name] = rtk.ParameterSharding("row_wise", ranks=list(range(world_size)), shards=[
                rtk.ShardMetadata.on_rank(r, r * block, 0, block, DIM) for r in range(world_size)])
    return out


def batches(candidates: int, seed: int):
    """(VBE KJT, the same batch expanded to B = USERS * candidates samples per feature)."""
    g = torch.Generator().manual_seed(seed)
    batch = USERS * candidates
    keys = [f"user{i}" for i in range(FEATURES)] + [f"item{i}" for i in range(FEATURES)]
    user_of_sample = torch.arange(USERS).repeat_interleave(candidates)
    vbe_lengths, vbe_values, full_lengths, full_values = [], [], [], []
    for i in range(FEATURES):  # user features: pooling factor i + 1, one bag per user
        lengths = torch.full((USERS,), i + 1)
        ids = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        vbe_lengths.append(lengths)
        vbe_values.append(ids)
        full_lengths.append(lengths[user_of_sample])
        full_values.append(ids.view(USERS, i + 1)[user_of_sample].reshape(-1))
    for _ in range(FEATURES):  # item features: one id per candidate
        ids = torch.randint(0, ROWS, (batch,), generator=g)
        for store in (vbe_lengths, full_lengths):
            store.append(torch.ones(batch, dtype=torch.int64))
        vbe_values.append(ids)
        full_values.append(ids)
    strides = [USERS] * FEATURES + [batch] * FEATURES
    inverse = torch.stack([user_of_sample] * FEATURES + [torch.arange(batch)] * FEATURES)
    vbe = rtk.KeyedJaggedTensor(keys=keys, values=torch.cat(vbe_values), lengths=torch.cat(vbe_lengths),
                                stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(keys, inverse))
    full = rtk.KeyedJaggedTensor(keys=keys, values=torch.cat(full_values), lengths=torch.cat(full_lengths))
    return vbe, full


def worker(rank: int, world_size: int, init_file: str, cases: list, result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    env = ShardingEnv.from_process_group(local_world_size=world_size)
    rows = []
    for kind, candidates in cases:
        torch.manual_seed(0)
        ebc = rtk.EmbeddingBagCollection(tables(), optimizer="sgd", lr=0.0)
        sharded = shard_embedding_bag_collection(ebc, plan(kind, world_size), env)
        vbe, full = batches(candidates, seed=rank)
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
    candidates = [int(c) for c in sys.argv[1:]] or [64, 256]
    cases = [(kind, c) for kind in ("row_wise", "table_wise") for c in candidates]
    with tempfile.TemporaryDirectory() as tmp:
        result_file = os.path.join(tmp, "rows.tsv")
        mp.start_processes(worker, args=(2, os.path.join(tmp, "rendezvous"), cases, result_file), nprocs=2,
                           join=True, start_method="spawn")
        rows = [line.split("\t") for line in open(result_file).read().splitlines()]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = ["# bench_vbe", "", __doc__.split("\n\n", 2)[2].strip().replace("\n", " "), "",
             f"2 ranks, 1 torch thread each, load average at the end {load} (a machine shared with other jobs), "
             f"torch {torch.__version__}, kernel backend {'fbgemm' if fbgemm_available() else 'torch'}.", "",
             "| plan | candidates per user | batch | input bytes expanded | input bytes VBE | input ratio | "
             "output bytes expanded | output bytes VBE | output ratio | step ms expanded | step ms VBE | speed-up |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_case = {}
    for kind, c, name, input_bytes, output_bytes, *ms in rows:
        by_case.setdefault((kind, int(c)), {})[name] = (int(input_bytes), int(output_bytes), [float(m) for m in ms])
    for (kind, c), result in by_case.items():
        (full_in, full_out, full_ms), (vbe_in, vbe_out, vbe_ms) = result["expanded"], result["VBE"]
        speed_ups = [f / v for f, v in zip(full_ms, vbe_ms)]  # per round: the two ran side by side
        lines.append(f"| {kind} | {c} | {USERS * c} | {full_in:,} | {vbe_in:,} | {full_in / vbe_in:.1f}x | "
                     f"{full_out:,} | {vbe_out:,} | {full_out / vbe_out:.1f}x | {spread(full_ms)} | {spread(vbe_ms)} | "
                     f"{spread(speed_ups, 'x', 2)} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / "vbe.md").write_text(text)


if __name__ == "__main__":
    main()
