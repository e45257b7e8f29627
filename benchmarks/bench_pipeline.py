"""Steps per second of sharded training with and without TrainPipelineSparseDist, 2 CPU ranks (gloo).

    .venv/bin/python benchmarks/bench_pipeline.py      # prints a markdown table, writes benchmarks/results/pipeline.md

Workload, chosen so that communication is a large part of the step and most of it is the input_dist the
pipeline can move (many ids per bag, narrow tables): TABLES tables of ROWS x DIM, one feature each, MEAN_IDS
ids per bag (lengths uniform in 0..2 MEAN_IDS), batch BATCH per rank, TABLE_WISE (tables alternate between the
ranks), fused Adagrad for the tables, Adam for a small dense part (DDP). 2 ranks, 1 intra-op thread each.
Two DMPs built alike train on the same batches: one through the plain loop (zero_grad, forward, backward, step),
one through the pipeline. After warm-up, ROUNDS rounds alternate the two (STEPS timed steps each, ranks aligned by
a barrier, the slowest rank counts). Printed: the median and range of steps/s of each, the median of the
per-round ratios, the share of the plain loop's time its ranks spent blocked in collectives (CommStats.wait_s:
the sharded modules' collectives; DDP's all-reduce not included) and the same for the pipeline, the load average,
and whether the two DMPs' weights are bit-identical at the end; `--runs` such runs one after the other (3).
`--quick`: one short run, nothing written. `--batch`, `--ids`: another workload.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

TABLES, ROWS, DIM, BATCH, MEAN_IDS, DENSE_IN = 8, 20_000, 8, 512, 32, 16


class Model(nn.Module):
    """EmbeddingBagCollection + a small dense part; forward(batch) -> (loss, loss), TorchRec's pipeline contract."""

    def __init__(self) -> None:
        super().__init__()
        import rectoolkit as rtk

        tables = [rtk.EmbeddingBagConfig(name=f"t{t}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{t}"])
                  for t in range(TABLES)]
        self.ebc = rtk.EmbeddingBagCollection(tables, optimizer="adagrad", lr=0.05)
        self.dense = nn.Linear(DENSE_IN, DIM)
        self.over = nn.Linear(DIM * (TABLES + 1), 1)

    def forward(self, batch):
        pooled = self.ebc(batch.sparse_features).values()
        logits = self.over(torch.cat([torch.relu(self.dense(batch.dense_features)), pooled], 1)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, loss.detach()


def make_batches(num: int, rank: int) -> List:
    from rectoolkit.sparse import KeyedJaggedTensor
    from rectoolkit.train.data import Batch

    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(num):
        lengths = torch.randint(0, 2 * MEAN_IDS + 1, (TABLES * BATCH,), generator=g)
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync([f"f{t}" for t in range(TABLES)], values, lengths)
        out.append(Batch(torch.randn(BATCH, DENSE_IN, generator=g), kjt,
                         (torch.rand(BATCH, generator=g) > 0.5).float()))
    return out


def build(world_size: int):
    from rectoolkit.distributed import DistributedModelParallel
    from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata

    torch.manual_seed(0)
    plan = {f"t{t}": ParameterSharding("table_wise", ranks=[t % world_size],
                                       shards=[ShardMetadata.on_rank(t % world_size, 0, 0, ROWS, DIM)])
            for t in range(TABLES)}
    dmp = DistributedModelParallel(Model(), plan=ShardingPlan({"ebc": plan}))
    dense = torch.optim.Adam(dmp.dense_parameters(), lr=0.01)
    return dmp, dense


def set_workload(batch: int, mean_ids: int) -> None:
    global BATCH, MEAN_IDS
    BATCH, MEAN_IDS = batch, mean_ids


def worker(rank: int, world_size: int, init_file: str, rounds: int, steps: int, out_file: str,
           workload: tuple) -> None:
    torch.set_num_threads(1)
    set_workload(*workload)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    from rectoolkit.distributed import TrainPipelineSparseDist

    warmup = 5
    total = warmup + rounds * steps
    batches = make_batches(total + 2, rank)
    plain_dmp, plain_opt = build(world_size)
    piped_dmp, piped_opt = build(world_size)
    pipeline = TrainPipelineSparseDist(piped_dmp, piped_opt, torch.device("cpu"))
    plain_feed, piped_feed = iter(batches[:total]), iter(batches[:total])

    def plain_step() -> None:
        batch = next(plain_feed)
        plain_opt.zero_grad()
        loss, _ = plain_dmp(batch)
        loss.backward()
        plain_opt.step()

    def piped_step() -> None:
        pipeline.progress(piped_feed)

    def input_side_wait(env) -> float:
        return env.stats.wait_s.get("metadata", 0.0) + env.stats.wait_s.get("input_dist", 0.0)

    def timed(step, count: int, env) -> tuple:
        """(seconds of the slowest rank; share of the ranks' time blocked in collectives, and in input_dist's)."""
        dist.barrier()
        waited, input_waited, started = env.stats.total_wait_s(), input_side_wait(env), time.perf_counter()
        for _ in range(count):
            step()
        elapsed = torch.tensor([time.perf_counter() - started, env.stats.total_wait_s() - waited,
                                input_side_wait(env) - input_waited], dtype=torch.float64)
        slowest, waits = elapsed.clone(), elapsed.clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        dist.all_reduce(waits)  # summed over ranks
        return float(slowest[0]), float(waits[1]) / float(waits[0]), float(waits[2]) / float(waits[0])

    timed(plain_step, warmup, plain_dmp.env)
    timed(piped_step, warmup, piped_dmp.env)
    results: Dict[str, list] = {"plain": [], "pipelined": [], "plain_wait": [], "pipelined_wait": [],
                                "plain_input_wait": [], "pipelined_input_wait": []}
    for _ in range(rounds):
        for name, step, env in (("plain", plain_step, plain_dmp.env), ("pipelined", piped_step, piped_dmp.env)):
            seconds, share, input_share = timed(step, steps, env)
            results[name].append(steps / seconds)
            results[name + "_wait"].append(share)
            results[name + "_input_wait"].append(input_share)
    try:  # the pipeline trains on the batch it holds last: run it out so both DMPs saw every batch
        while True:
            pipeline.progress(piped_feed)
    except StopIteration:
        pass
    plain_state, piped_state = plain_dmp.state_dict(), piped_dmp.state_dict()
    identical = all(torch.equal(v, piped_state[k]) for k, v in plain_state.items())
    if rank == 0:
        torch.save({**results, "identical": identical, "steps_trained": total}, out_file)
    dist.barrier()
    dist.destroy_process_group()


def summary(values: List[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def run_once(rounds: int, steps: int) -> Dict:
    """One spawn of the 2 ranks: their results, with the load average before and after."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "results.pt")
        mp.start_processes(worker, args=(2, os.path.join(tmp, "rdzv"), rounds, steps, out_file, (BATCH, MEAN_IDS)),
                           nprocs=2, join=True, start_method="spawn")
        results = torch.load(out_file)
    results["load"] = (load_before, os.getloadavg())
    results["ratios"] = [p / q for p, q in zip(results["pipelined"], results["plain"])]
    return results


def row(run: int, results: Dict) -> str:
    (before, after), ratios = results["load"], results["ratios"]
    return (f"| {run} | {summary(results['plain'])} | {summary(results['pipelined'])} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{statistics.median(results['plain_wait']):.0%} ({statistics.median(results['plain_input_wait']):.0%}) | "
            f"{statistics.median(results['pipelined_wait']):.0%} ({statistics.median(results['pipelined_input_wait']):.0%}) | "
            f"{before[0]:.1f} / {after[0]:.1f} | {'yes' if results['identical'] else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run of 5 rounds of 10 steps")
    parser.add_argument("--runs", type=int, default=3, help="spawns of the 2 ranks, one after the other")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=BATCH, help="samples per rank per step")
    parser.add_argument("--ids", type=int, default=MEAN_IDS, help="mean ids per bag")
    args = parser.parse_args()
    set_workload(args.batch, args.ids)
    runs, rounds, steps = (1, 5, 10) if args.quick else (args.runs, args.rounds, args.steps)
    results = [run_once(rounds, steps) for _ in range(runs)]
    all_ratios = [r for result in results for r in result["ratios"]]
    lines = [
        "# bench_pipeline",
        "",
        f"TrainPipelineSparseDist vs the plain loop: {TABLES} tables of {ROWS:,} x {DIM} (TABLE_WISE, fused Adagrad), "
        f"~{MEAN_IDS} ids per bag, batch {BATCH} per rank, a small dense part (Adam, DDP); 2 CPU ranks (gloo), "
        f"1 intra-op thread each. torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, shared "
        f"with other jobs. {runs} runs; each: {rounds} alternating rounds of {steps} steps after 5 warm-up steps. "
        "steps/s of the slowest rank, median (range over the rounds); ratio = median (range) of the per-round ratios "
        "pipelined / plain. Wait share = time the ranks spent blocked in the sharded modules' collectives / their "
        "time (DDP's all-reduce not counted); in brackets the part of it in input_dist (metadata + ids), the only "
        "collectives the pipeline moves: the most it can save. Load = 1-minute load average before / after the run. Identical = "
        "the two DMPs' weights bit for bit at the end of the run (both trained on the same batches).",
        "",
        "| run | plain steps/s | pipelined steps/s | ratio | plain wait share | pipelined wait share | load | identical |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *[row(k + 1, result) for k, result in enumerate(results)],
        "",
        f"All rounds of all runs: median ratio {statistics.median(all_ratios):.2f}x, "
        f"{sum(r >= 1.2 for r in all_ratios)} of {len(all_ratios)} rounds at 1.2x or more.",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.quick:
        path = Path(__file__).parent / "results" / "pipeline.md"
        path.write_text(text + "\n")
        print(f"\nwritten to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
