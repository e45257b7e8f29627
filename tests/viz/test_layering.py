"""Import direction: the core never pulls in viz, widgets or Jupyter packages; viz never pulls in widgets."""

import subprocess
import sys

import pytest

CORE = ["rectoolkit", "rectoolkit.sparse", "rectoolkit.modules", "rectoolkit.kernels", "rectoolkit.plan",
        "rectoolkit.planner", "rectoolkit.distributed", "rectoolkit.launch", "rectoolkit.train"]
JUPYTER = ["ipywidgets", "plotly", "matplotlib", "IPython", "anywidget", "rectoolkit.viz", "rectoolkit.widgets"]


def _loaded_after(imports, candidates):
    code = (f"import importlib, sys\nfor name in {imports!r}:\n    importlib.import_module(name)\n"
            f"print(','.join(m for m in {candidates!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return [m for m in result.stdout.strip().split(",") if m]


@pytest.mark.timeout(180)
def test_core_imports_no_jupyter_packages():
    assert _loaded_after(CORE, JUPYTER) == []


@pytest.mark.timeout(180)
def test_viz_does_not_import_widgets():
    assert _loaded_after(["rectoolkit.viz", "rectoolkit.viz.routing"], ["ipywidgets", "anywidget", "rectoolkit.widgets"]) == []
