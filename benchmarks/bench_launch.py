"""Launcher and training-recipe numbers: worker start-up, metrics streaming rate, recipe samples/s.

Run: `.venv/bin/python benchmarks/bench_launch.py` (prints markdown tables; not run by the tests).
"""

from __future__ import annotations

import time

import torch

from rectoolkit.launch import WorkerContext, launch
from rectoolkit.train import TrainConfig, train


def first_report(ctx):
    ctx.report(step=0)
    return ctx.rank


def stream(ctx, count):
    for step in range(count):
        ctx.report(step=step, loss=1.0 / (step + 1))
    return count


def startup_rows():
    rows = []
    for world_size in (1, 2):
        began = time.perf_counter()
        first = []
        launch(first_report, world_size, num_threads=1, echo_output=False,
               on_metrics=lambda m: first.append(time.perf_counter() - began))
        rows.append((world_size, first[0], time.perf_counter() - began))
    return rows


def streaming_rate(count=5000):
    began = time.perf_counter()
    received = []
    launch(stream, 2, count, num_threads=1, echo_output=False, on_metrics=received.append)
    return len(received), len(received) / (time.perf_counter() - began)


def recipe_rows(steps=60):
    config = TrainConfig(workload="dlrm26", steps=steps, batch_size=256, max_rows=10_000, embedding_dim=16,
                         report_every=steps, progress=False)
    rows = []
    torch.set_num_threads(1)
    summary = train(WorkerContext.single_process(), config)
    rows.append(("inline, 1 process", summary["mode"], summary["samples_per_s"]))
    summaries = launch(train, 2, config, num_threads=1, echo_output=False)
    rows.append(("launch, 2 workers", summaries[0]["mode"], summaries[0]["samples_per_s"]))
    return rows


def main():
    print("| world size | first report after (s) | job done after (s) |")
    print("| --- | --- | --- |")
    for world_size, first, total in startup_rows():
        print(f"| {world_size} | {first:.2f} | {total:.2f} |")
    count, rate = streaming_rate()
    print(f"\nmetrics streamed from 2 workers: {count} reports at {rate:,.0f} reports/s (including start-up)\n")
    print("| recipe (dlrm26, rows<=10k, dim 16, batch 256/rank, 1 thread/rank) | mode | samples/s |")
    print("| --- | --- | --- |")
    for name, mode, rate in recipe_rows():
        print(f"| {name} | {mode} | {rate:,.0f} |")


if __name__ == "__main__":
    main()
