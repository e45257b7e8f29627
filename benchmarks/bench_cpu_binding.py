"""Local ranks bound to their own cores, or left to the scheduler: step time of the same plans both ways.

    .venv/bin/python benchmarks/bench_cpu_binding.py               # writes benchmarks/results/cpu_binding.md
    .venv/bin/python benchmarks/bench_cpu_binding.py --quick --no-write

The plans of bench_cost_model (its workloads; the hand plans without data_parallel, and TorchRec 1.8's plan) run
through `rectoolkit.planner.measure_plans` on 2 local CPU ranks (gloo, one torch thread each, fused SGD), once
with `cpu_binding="none"` and once with `cpu_binding="auto"` (each rank bound to its own share of the cores:
rectoolkit.launch.affinity), the two launches alternating, `--repeats` times. Reported per plan: the measured
step time (median over timed steps of the slowest rank's wall time) unbound and bound, median (range) over the
repeats; bound / unbound, median (range) of the per-repeat ratios (each pair ran back to back, so alike load);
and the busiest rank's CPU time per step both ways. The load average is that of the whole run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_cost_model as cost_bench  # noqa: E402  (the workloads and plans are that benchmark's)

BINDINGS = ("none", "auto")


def spread(values: List[float], digits: int = 1, suffix: str = "") -> str:
    return (f"{statistics.median(values):.{digits}f}{suffix} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f}{suffix})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=list(cost_bench.WORKLOADS), default=list(cost_bench.WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3, help="unbound / bound launch pairs per workload")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="one repeat of 2 rounds of 8 steps")
    parser.add_argument("--no-write", action="store_true", help="print only (no results/cpu_binding.md)")
    args = parser.parse_args()
    repeats, steps, rounds = (1, 8, 2) if args.quick else (args.repeats, args.steps, args.rounds)
    started, load_before = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    lines = [
        "# bench_cpu_binding",
        "",
        f"measure_plans on 2 local CPU ranks (gloo, 1 torch thread each, fused SGD), cpu_binding 'none' vs 'auto' "
        f"(each rank on its own core here), the launches alternating; {repeats} pair(s) per workload, each launch "
        f"{rounds} rounds of {steps} steps. torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores. "
        "step ms = median over timed steps of the slowest rank's wall time; CPU ms = the busiest rank's CPU time per "
        "step (median); median (range) over the repeats.",
        "",
    ]
    for name in args.workloads:
        workload = cost_bench.WORKLOADS[name]()
        plans = cost_bench.hand_plans(workload, cost_bench.WORLD_SIZE)
        plans.pop("data_parallel")  # hundreds of ms a step and a dense all-reduce: not what binding is about
        plans["torchrec"] = cost_bench.torchrec_plan(workload, cost_bench.WORLD_SIZE)
        step: Dict[str, Dict[str, List[float]]] = {b: {p: [] for p in plans} for b in BINDINGS}
        cpu: Dict[str, Dict[str, List[float]]] = {b: {p: [] for p in plans} for b in BINDINGS}
        for repeat in range(repeats):
            for binding in BINDINGS:
                result = cost_bench.measure_workload(plans, workload, steps=steps, rounds=rounds, phase_steps=0,
                                                     cpu_binding=binding)
                frame = result.plans.set_index("plan")
                for plan in plans:
                    step[binding][plan].append(float(frame.loc[plan, "step_ms"]))
                    cpu[binding][plan].append(float(frame.loc[plan, "cpu_ms"]))
                print(f"{name} repeat {repeat} {binding}: load {os.getloadavg()[0]:.1f}, cores {result.info['cpus']}",
                      file=sys.stderr, flush=True)
        lines += [f"## workload `{name}`", "",
                  "| plan | step ms unbound | step ms bound | bound / unbound | CPU ms unbound | CPU ms bound |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        ratios = {p: [b / u for u, b in zip(step["none"][p], step["auto"][p])] for p in plans}
        for plan in plans:
            lines.append(f"| {plan} | {spread(step['none'][plan])} | {spread(step['auto'][plan])} | "
                         f"{spread(ratios[plan], 2, 'x')} | {spread(cpu['none'][plan])} | {spread(cpu['auto'][plan])} |")
        faster = sum(statistics.median(r) < 1 for r in ratios.values())
        lines += ["", f"Bound faster (median ratio < 1) for {faster} of {len(plans)} plans.", ""]
    lines.append(f"Run {started}, load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after.")
    text = "\n".join(lines)
    print(text)
    if not (args.quick or args.no_write):
        path = Path(__file__).parent / "results" / "cpu_binding.md"
        path.write_text(text + "\n")
        print(f"\nwritten to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
