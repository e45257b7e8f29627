"""`make bench`: run every benchmarks/bench_*.py, then gather benchmarks/results/*.md into RESULTS.md.

Each benchmark prints its table and writes it to benchmarks/results/<area>.md. Run one alone with
`.venv/bin/python benchmarks/bench_<area>.py`.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    only = sys.argv[1:]
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        if only and not any(name in script.name for name in only):
            continue
        print(f"\n=== {script.name} ===", flush=True)
        started = time.perf_counter()
        code = subprocess.call([sys.executable, str(script)], cwd=HERE.parent)
        print(f"=== {script.name}: exit {code} in {time.perf_counter() - started:.0f} s ===", flush=True)
        if code:
            failed.append(script.name)
    write_results()
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


def write_results() -> None:
    parts = [
        "# Benchmark results",
        "",
        "Written by `make bench` (benchmarks/run_all.py) from benchmarks/results/*.md.",
        f"Machine: {platform.machine()}, {platform.processor() or 'cpu'}, Python {platform.python_version()}.",
        "",
    ]
    for result in sorted((HERE / "results").glob("*.md")):
        parts += [result.read_text().rstrip(), ""]
    (HERE / "RESULTS.md").write_text("\n".join(parts))


if __name__ == "__main__":
    sys.exit(main())
