"""README.md stays true: every ```python block in it runs as written (each in a fresh interpreter)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 3, "README.md should show the planning, training and jagged-type examples"


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, tmp_path):
    code = BLOCKS[index]
    # faulthandler on: a run past the limit is stopped with SIGABRT, which prints where every thread of it was
    process = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", code], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        stdout, stderr = process.communicate()
        pytest.fail(f"README example {index} ran past 300 s; where it was:\n{stderr[-6000:]}\n--- stdout ---\n"
                    f"{stdout[-2000:]}")
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert done.returncode == 0, f"README example {index} failed:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
    # The values the README's comments promise (written by hand from the example's inputs).
    if "KeyedJaggedTensor(" in code:
        assert "[tensor([21, 22]), tensor([23, 24])]" in done.stdout
    if "EmbeddingShardingPlanner" in code and '"large"' in code:
        for table in ("large", "wide", "small"):
            assert table in done.stdout
    if "measure_top_k" in code:  # the calibrated planner: its explanation, then the candidates it measured
        assert "Estimated step:" in done.stdout and "Candidate plans" in done.stdout and "chosen" in done.stdout
        assert "est_step_ms" in done.stdout and "step_ms" in done.stdout.replace("est_step_ms", "")
        assert "measured" in done.stdout.split("Candidate plans")[1], "explain() should show the measured times"
    if "rtk.launch(" in code:
        first, final = (float(x) for x in done.stdout.strip().splitlines()[-1].split(" -> "))
        assert final < first, "the training example should show the loss falling"
