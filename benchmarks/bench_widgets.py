"""Re-plan + redraw latency of the PlanExplorer (Python time only, no browser).

    .venv/bin/python benchmarks/bench_widgets.py            # prints a markdown table, writes benchmarks/results/widgets.md

For 100 tables on 8 ranks (target: under 200 ms per change), each control change is timed end to end through
`PlanExplorer.replan()`: the planner (plan + report), then the in-place redraw of the visible tab (the
Placement tab: shard rectangles + rank x table map, the heaviest). "all tabs" adds the redraw of every other
view (board, memory, time, communication, table choices), which the widget otherwise does when a tab opens.
Times are CPU time of this process (`time.process_time`), so other work on the machine does not inflate them.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rectoolkit.modules.configs import EmbeddingBagConfig  # noqa: E402
from rectoolkit.widgets.explorer import PlanExplorer  # noqa: E402
from rectoolkit.widgets.inputs import TableSet  # noqa: E402


def random_tables(count: int, seed: int = 0) -> TableSet:
    rng = np.random.default_rng(seed)
    tables, factors = [], {}
    for index in range(count):
        rows = int(10 ** rng.uniform(3, 7))
        dim = int(rng.choice([16, 32, 64, 128]))
        tables.append(EmbeddingBagConfig(name=f"t{index:03d}", num_embeddings=rows, embedding_dim=dim,
                                         feature_names=[f"f{index:03d}"]))
        factors[f"f{index:03d}"] = float(rng.uniform(1, 30))
    return TableSet(tables, factors, batch_size=512, source="random")


def time_changes(explorer: PlanExplorer, changes, repeats: int):
    rows = []
    for label, change in changes:
        plan_ms, draw_ms, total_ms, all_ms = [], [], [], []
        for _ in range(repeats):
            for value in change:
                explorer.set(**value) if isinstance(value, dict) else explorer.force(*value)
                timing = explorer.last_timing_ms
                plan_ms.append(timing["plan_ms"])
                draw_ms.append(timing["draw_ms"])
                total_ms.append(timing["total_ms"])
                start = time.process_time()
                explorer.redraw_all()
                all_ms.append(timing["draw_ms"] + 1e3 * (time.process_time() - start))
        rows.append((label, statistics.median(plan_ms), statistics.median(draw_ms), statistics.median(all_ms),
                     statistics.median(total_ms), "ok" if explorer.error is None else "error shown"))
    return rows


def main(num_tables: int = 100, world_size: int = 8, repeats: int = 3, local_search: bool = True) -> str:
    table_set = random_tables(num_tables)
    start = time.perf_counter()
    explorer = PlanExplorer(table_set, world_size=world_size, local_world_size=world_size, memory_per_rank_gib=16,
                            local_search=local_search)
    build_s = time.perf_counter() - start
    first = table_set.tables[0].name
    changes = [
        ("batch size 512 <-> 1024", [{"batch_size": 1024}, {"batch_size": 512}]),
        ("optimizer sgd <-> adam", [{"optimizer": "adam"}, {"optimizer": "sgd"}]),
        ("objective time <-> memory", [{"objective": "memory"}, {"objective": "time"}]),
        ("memory per rank 16 <-> 8 GiB", [{"memory_per_rank_gib": 8.0}, {"memory_per_rank_gib": 16.0}]),
        (f"force {first} row_wise <-> auto", [(first, "row_wise"), (first, "auto")]),
        ("ranks per host 8 <-> 4", [{"local_world_size": 4}, {"local_world_size": 8}]),
        ("world size 8 <-> 16 (traces rebuilt)", [{"world_size": 16}, {"world_size": 8}]),
    ]
    rows = time_changes(explorer, changes, repeats)
    lines = [
        f"## PlanExplorer re-plan + redraw, {num_tables} tables on {world_size} ranks, "
        f"{'full search (greedy + local moves/swaps)' if local_search else 'greedy search only (local_search=False)'}",
        "",
        f"CPU ms per control change (median of {2 * repeats}); widget built in {build_s:.1f} s wall (first figure "
        "included). plan = planner.plan + planner.report; redraw = visible tab; "
        "total = plan + redraw. Target: total < 200 ms.",
        "",
        "| change | plan ms | redraw ms (visible tab) | redraw ms (all tabs) | total ms | state |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [f"| {label} | {p:.1f} | {d:.1f} | {a:.1f} | {t:.1f} | {s} |" for label, p, d, a, t, s in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    table = main() + "\n" + main(local_search=False)
    print(table)
    out = ROOT / "benchmarks" / "results" / "widgets.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
