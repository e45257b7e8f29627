"""The docs pages' examples stay true: every ```python block of the pages below runs as written (each in a fresh
interpreter), and prints what the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = ["two_dimensional.md"]
BLOCKS = [(page, block) for page in PAGES
          for block in re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)]


def test_the_pages_have_examples():
    assert {page for page, _ in BLOCKS} == set(PAGES)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("page, code", BLOCKS, ids=[f"{page}-{i}" for i, (page, _) in enumerate(BLOCKS)])
def test_docs_example_runs(page, code, tmp_path):
    done = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], cwd=tmp_path, text=True,
                          capture_output=True, timeout=280)
    assert done.returncode == 0, f"{page} example failed:\n--- stderr ---\n{done.stderr[-4000:]}"
    if page == "two_dimensional.md" and "compare_sharding_group_sizes" in code:  # a row per size, G = W no sync
        rows = [line.split() for line in done.stdout.splitlines()[1:]]
        assert [row[0] for row in rows] == ["4", "8", "16", "32"], done.stdout
        assert [row[1] for row in rows] == ["8", "4", "2", "1"] and float(rows[-1][4]) == 0.0, done.stdout
        memory = [float(row[-1]) for row in rows]
        assert memory == sorted(memory, reverse=True), done.stdout  # smaller groups hold more of the tables
    elif page == "two_dimensional.md":  # the groups as the page lays them out; the sync's bytes as computed
        lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
        groups = {0: "[0, 2]", 1: "[1, 3]", 2: "[0, 2]", 3: "[1, 3]"}
        replicas = {0: "[0, 1]", 1: "[0, 1]", 2: "[2, 3]", 3: "[2, 3]"}
        assert len(lines) == 4, done.stdout
        for rank, line in enumerate(lines):
            assert f"sharding group {groups[rank]}, replicas {replicas[rank]}" in line, line
            sent, computed = re.search(r"sync sent ([\d,]+) bytes \(computed ([\d,]+)\)", line).groups()
            assert sent == computed and sent != "0", line
