"""The PlanExplorer as a learner sees it: first paint, first opening of a tab, a control change (real Chromium).

    .venv/bin/python benchmarks/bench_browser.py [runs] [--against DIR]    # writes benchmarks/results/browser.md

`--against DIR` measures another checkout too (e.g. `git archive main | tar -x -C DIR`), alternating runs of
the two in one session, and puts both in the table.

Runs tests/browser/test_explorer_timing.py (JupyterLab + headless Chromium; needs /usr/bin/chromium and
playwright) `runs` times and reports the median of what the page measured (performance.now() in the page,
from just before the action until the target is on screen; "settled" is the last DOM change after it).
Targets (issue 14): explorer < 2 s, a tab's first figure < 1 s, a change visible < 250 ms, settled < 400 ms.
The load average is part of the result: on a shared 2-core machine the same code measures several times slower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]


def run_once(artifacts: Path, root: Path = ROOT) -> dict:
    env = dict(os.environ, NB_ARTIFACTS=str(artifacts), PYTHONPATH=str(root))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "tests/browser/test_explorer_timing.py"], cwd=root, env=env, check=True)
    return json.loads((artifacts / "browser" / "explorer_timings.json").read_text())


def spread(values) -> str:
    """'median (min-max)' of ms values."""
    values = [v or 0 for v in values]
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main(runs: int = 3, against: Optional[Path] = None) -> str:
    checkouts = {"this checkout": ROOT} | ({f"{against}": against} if against is not None else {})
    results: Dict[str, List[dict]] = {name: [] for name in checkouts}
    for _ in range(runs):
        for name, root in checkouts.items():  # alternating, so both see the same machine load
            with tempfile.TemporaryDirectory(prefix="rtk-bench-browser-") as folder:
                results[name].append(run_once(Path(folder), root))
    loads = [r.pop("load average") for name in checkouts for r in results[name]]
    names = list(checkouts)
    lines = [
        f"## PlanExplorer in JupyterLab + headless Chromium (median and range of {runs} runs"
        + (f", alternating with {names[1]}" if len(names) > 1 else "") + ")",
        "",
        f"ms measured in the page; {os.cpu_count()} CPUs; load average (1, 5, 15 min) at the end of each run: "
        + "; ".join(f"{a:.1f} {b:.1f} {c:.1f}" for a, b, c in loads) + ". Targets from issue 14: explorer < 2000,"
        " tab < 1000, change visible < 250 and settled < 400.",
        "",
        "| step | what is on screen | " + " | ".join(f"{n}: ms | visible | settled" for n in names) + " |",
        "| --- | --- |" + " ---: | ---: | ---: |" * len(names),
    ]
    first = results[names[0]][0]
    for step in first:
        for target in [k for k in first[step] if k not in ("visible", "settled")]:
            cells = []
            for name in names:
                measured = [r[step] for r in results[name] if step in r]
                cells += ([spread(m[key] for m in measured) for key in (target, "visible", "settled")]
                          if measured else ["-"] * 3)
            lines.append(f"| {step} | {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=int, default=3)
    parser.add_argument("--against", type=Path, default=None, help="another checkout to measure alternately")
    arguments = parser.parse_args()
    table = main(arguments.runs, arguments.against)
    print(table)
    out = ROOT / "benchmarks" / "results" / "browser.md"
    out.write_text(table)
