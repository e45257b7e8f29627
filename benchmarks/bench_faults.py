"""Interrupting training: SIGINT at a random moment, every worker and helper gone, the next launch works.

Each repetition launches data-parallel training of a small MLP (forward, backward, gradients all-reduced
over gloo, SGD step, a report per step) on 2 workers with 1 thread each; each worker first starts two helper
processes, one in its process group and one that left it, and sends SIGINT to the caller at a moment drawn uniformly from 0-3 s after the first metrics
arrived (a process-directed signal, as Ctrl-C or Jupyter's interrupt button sends). It measures the time
from the signal to KeyboardInterrupt in the caller, and to the moment no process of the job is alive
(workers and helpers, found by an environment mark they all carry), and counts the ones left over. The
repetitions run in a few caller processes, several each, so every launch after the first in a caller shows
that the next launch works; each caller ends with one uninterrupted launch.

Run: `nice .venv/bin/python benchmarks/bench_faults.py [repetitions]` (default 100; takes minutes);
writes benchmarks/results/faults.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
PER_CALLER = 10
CALLER_TIMEOUT_S = 1200

CALLER = r'''
import faulthandler, json, os, random, signal, subprocess, sys, threading, time
from rectoolkit.launch import launch
from rectoolkit.launch._reap import tagged_processes

MARK = os.environ["BENCH_FAULTS_MARK"]
signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with SIGINT ignored

def marked_processes():
    return tagged_processes(MARK, variable="BENCH_FAULTS_MARK")  # live processes of this caller's jobs

def work(ctx, steps):
    """Data-parallel training of a small MLP: forward, backward, gradients all-reduced, SGD step, report."""
    import torch
    import torch.distributed as dist
    subprocess.Popen(["sleep", "600"])
    subprocess.Popen(["sleep", "600"], start_new_session=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(ctx.rank)
    for step in range(steps):
        features = torch.randn(256, 64, generator=generator)
        loss = torch.nn.functional.mse_loss(model(features), features[:, :1])
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
            parameter.grad /= ctx.world_size
        optimizer.step()
        ctx.report(step=step, loss=loss.item())
    return steps

rng = random.Random(int(sys.argv[2]))
for repetition in range(int(sys.argv[1])):
    faulthandler.dump_traceback_later(300, exit=True)  # a hang is reported, not waited for
    first_metrics, sent = threading.Event(), {}
    delay_s = rng.uniform(0.0, 3.0)
    def interrupt():
        first_metrics.wait()
        time.sleep(delay_s)
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    outcome, seen = "returned", 0
    try:
        launch(work, 2, 1_000_000, num_threads=1, grace_s=3.0, echo_output=False,
               on_metrics=lambda m: first_metrics.set())
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    except BaseException as error:
        outcome = f"{type(error).__name__}: {error}"[:300]
    raised_at = time.monotonic()
    while marked_processes() and time.monotonic() - raised_at < 30:
        time.sleep(0.01)
    gone_at = time.monotonic()
    print("REP " + json.dumps({"outcome": outcome, "delay_s": delay_s,
                               "to_raise_s": raised_at - sent.get("at", raised_at),
                               "to_gone_s": gone_at - sent.get("at", raised_at),
                               "leftover": len(marked_processes())}), flush=True)
    faulthandler.cancel_dump_traceback_later()
results = launch(work, 2, 3, num_threads=1, echo_output=False)
print("NEXT " + json.dumps({"ok": results == [3, 3]}), flush=True)
'''


def run(repetitions: int, progress=None) -> dict:
    """Run the repetitions; `progress(result_so_far)` after each caller (results are written as they come)."""
    load_before = os.getloadavg()
    reps, next_ok, failures = [], [], []
    began = time.perf_counter()
    script = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_faults_caller_{os.getpid()}.py"
    script.write_text(CALLER)
    try:
        for seed, start in enumerate(range(0, repetitions, PER_CALLER)):
            count = min(PER_CALLER, repetitions - start)
            mark = uuid.uuid4().hex
            env = dict(os.environ, PYTHONPATH=str(HERE.parent), BENCH_FAULTS_MARK=mark)
            try:
                done = subprocess.run([sys.executable, str(script), str(count), str(seed)], env=env,
                                      capture_output=True, text=True, timeout=CALLER_TIMEOUT_S)
                out, err = done.stdout, done.stderr
            except subprocess.TimeoutExpired as expired:
                out, err = expired.stdout or "", f"caller timed out: {expired}"
            lines = out.splitlines()
            reps += [json.loads(line[4:]) for line in lines if line.startswith("REP ")]
            next_ok += [json.loads(line[5:])["ok"] for line in lines if line.startswith("NEXT ")]
            if not any(line.startswith("NEXT ") for line in lines):
                failures.append(err[-2000:] if isinstance(err, str) else str(err))
            print(f"caller {seed}: {sum(1 for line in lines if line.startswith('REP '))} repetitions", flush=True)
            if progress is not None:
                progress({"reps": reps, "next_ok": next_ok, "failures": failures, "load_before": load_before,
                          "wall_s": time.perf_counter() - began, "load_after": os.getloadavg(),
                          "repetitions": repetitions})
    finally:
        script.unlink(missing_ok=True)
    return {"reps": reps, "next_ok": next_ok, "failures": failures, "wall_s": time.perf_counter() - began,
            "load_before": load_before, "load_after": os.getloadavg(), "repetitions": repetitions}


def report(result: dict) -> str:
    reps = result["reps"]
    interrupted = [r for r in reps if r["outcome"] == "KeyboardInterrupt"]
    raise_s = sorted(r["to_raise_s"] for r in interrupted)
    gone_s = sorted(r["to_gone_s"] for r in interrupted)
    within_5s = sum(1 for r in interrupted if r["to_gone_s"] <= 5.0 and r["leftover"] == 0)
    leftover = sum(r["leftover"] for r in reps)
    others = sorted({r["outcome"] for r in reps} - {"KeyboardInterrupt"})

    def quantiles(values):
        if not values:
            return "n/a"
        p95 = values[min(len(values) - 1, int(0.95 * len(values)))]
        return f"{statistics.median(values):.2f} / {p95:.2f} / {values[-1]:.2f}"

    lines = [
        "# Interrupting training (benchmarks/bench_faults.py)",
        "",
        f"{result['repetitions']} repetitions: SIGINT to the caller at a uniformly random moment 0-3 s after the "
        f"first metrics of data-parallel MLP training (gradients all-reduced each step, a report per step) on 2 "
        f"workers x 1 thread, each worker running 2 helper processes (one outside its process group). "
        f"{os.cpu_count()} CPUs; load average {result['load_before'][0]:.1f} before, "
        f"{result['load_after'][0]:.1f} after; {result['wall_s'] / 60:.1f} min in all.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| repetitions that ended | {len(reps)} of {result['repetitions']} planned |",
        f"| KeyboardInterrupt raised in the caller | {len(interrupted)} |",
        f"| other outcomes | {', '.join(others) if others else 'none'} |",
        f"| signal -> KeyboardInterrupt, s (median / p95 / max) | {quantiles(raise_s)} |",
        f"| signal -> no process of the job alive, s (median / p95 / max) | {quantiles(gone_s)} |",
        f"| every process gone within 5 s | {within_5s} of {len(reps)} |",
        f"| processes left behind (workers + helpers) | {leftover} |",
        f"| next launch in the same process worked | {sum(result['next_ok'])} of {len(result['next_ok'])} "
        f"callers (and every repetition after the first of each caller) |",
    ]
    if result["failures"]:
        lines += ["", "Callers that did not finish:", "", "```", *result["failures"], "```"]
    return "\n".join(lines) + "\n"


def write(result: dict) -> str:
    text = report(result)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "faults.md").write_text(text)
    return text


def main() -> None:
    repetitions = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(write(run(repetitions, progress=write)))


if __name__ == "__main__":
    main()
