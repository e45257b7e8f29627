"""Row-block routing (ROW_WISE, TABLE_ROW_WISE, GRID_SHARD input_dist): a mask per block vs numbering and sorting.

rectoolkit.distributed.row_wise.block_ids picks one of two ways by batch size: a mask of each block over its
feature's ids (a fixed number of tensor ops, but each over ids x blocks per feature), or each id numbered by the
block that holds its row and a stable sort of the numbers (a few passes over the ids whatever the blocks). Both run
here on the same batches, alternating round by round (7 rounds, best of 5 calls each, 1 torch thread): the routing
of one rank's batch to W row blocks of every table. Checks both give equal results first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from rectoolkit.distributed import row_wise
from rectoolkit.distributed.feature_shards import FeatureBatch

HERE = Path(__file__).resolve().parent
# (features, bags, mean ids per bag, rows per table, row blocks per table): dlrm26-like one-hot batches and
# bench_pipeline's `comm` workload
CASES = [(26, 64, 5, 100_000, 2), (26, 512, 5, 100_000, 2), (26, 512, 5, 100_000, 4),
         (16, 256, 64, 20_000, 2), (16, 256, 64, 20_000, 4), (16, 256, 64, 20_000, 8)]


def make_batch(features: int, bags: int, mean_ids: int, rows: int, seed: int = 0) -> FeatureBatch:
    g = torch.Generator().manual_seed(seed)
    names = [f"f{i}" for i in range(features)]
    lengths = torch.randint(0, 2 * mean_ids + 1, (features, bags), generator=g)
    counts = lengths.sum(1).tolist()
    values = torch.randint(0, rows, (sum(counts),), generator=g).split(counts)
    starts = [sum(counts[:i]) for i in range(features)]
    return FeatureBatch(bags, dict(zip(names, values)), dict(zip(names, lengths)), dict.fromkeys(names),
                        dict(zip(names, starts)))


def routed(batch: FeatureBatch, blocks, way: str):
    saved = row_wise._MASKED_IDS
    row_wise._MASKED_IDS = 10 ** 15 if way == "masks" else 0
    try:
        return row_wise.block_ids(batch, blocks)
    finally:
        row_wise._MASKED_IDS = saved


def best_ms(fn, calls: int = 5) -> float:
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def run(rounds: int) -> str:
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    lines = [f"1 torch thread; 1-minute load average {load:.1f} before; torch {torch.__version__}. Best of 5 calls "
             f"per round, {rounds} rounds alternating the two ways; median [min, max] over the rounds.", "",
             "| features x bags | ids | blocks per table | masks ms | numbers ms | masks / numbers | "
             "block_ids picks |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for features, bags, mean_ids, rows, W in CASES:
        batch = make_batch(features, bags, mean_ids, rows)
        block = -(-rows // W)
        blocks = [(f, r * block, min(rows, (r + 1) * block), False) for r in range(W) for f in batch.values]
        for a, b in zip(routed(batch, blocks, "masks"), routed(batch, blocks, "numbers")):
            assert torch.equal(a.ids, b.ids) and torch.equal(a.lengths, b.lengths)
        times = {"masks": [], "numbers": []}
        for _ in range(rounds):
            for way in times:
                times[way].append(best_ms(lambda: routed(batch, blocks, way)))
        ratios = [m / n for m, n in zip(times["masks"], times["numbers"])]
        ids = sum(v.numel() for v in batch.values.values())
        picks = "masks" if ids * W <= row_wise._MASKED_IDS else "numbers"
        cell = lambda v: f"{statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]"  # noqa: E731
        lines.append(f"| {features} x {bags} | {ids:,} | {W} | {cell(times['masks'])} | {cell(times['numbers'])} | "
                     f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}] | {picks} |")
    lines += ["", f"1-minute load average {os.getloadavg()[0]:.1f} after."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    table = "# bench_routing\n\n" + __doc__.split("\n\n", 1)[1].strip() + "\n\n" + run(args.rounds) + "\n"
    print(table)
    if not args.no_write:
        (HERE / "results" / "routing.md").write_text(table)


if __name__ == "__main__":
    main()
