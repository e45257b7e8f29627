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


# ------------------------------------------------------------------------------------------------ static graph
# Every import in rectoolkit/ (lazy ones inside functions included) read with ast, checked against the layers.
# Bottom to top; a module may import its own package and the packages below it. The path modules declared in
# rectoolkit.compat are exempt (they exist to re-export across the layers).
import ast  # noqa: E402
from pathlib import Path  # noqa: E402

import rectoolkit.compat  # noqa: E402

PACKAGE_ROOT = Path(rectoolkit.compat.__file__).parent
LAYERS = ["fbgemm_probe", "streamable", "sparse", "kernels", "optim", "modules", "plan", "planner", "distributed",
          "quant", "fx", "inference", "launch", "workloads", "data", "metrics", "train", "measure", "models", "datasets",
          "viz", "widgets", "compat", "__init__"]
# The planner's measuring modules run the sharded engine on spawned workers (distributed, launch, train's data):
# they are a layer of their own above train. The planner reaches them only from the two calls that run a
# measurement (measure_top_k, Topology.calibrate), by a lazy import there, and its package re-exports them.
MODULE_LAYERS = {"rectoolkit.planner.measure": "measure", "rectoolkit.planner.measure_worker": "measure",
                 "rectoolkit.planner.calibrate": "measure"}
MEASURE_CALLERS = {("rectoolkit.planner.planner", "rectoolkit.planner.measure"),
                   ("rectoolkit.planner.topology", "rectoolkit.planner.calibrate"),
                   ("rectoolkit.planner", "rectoolkit.planner.measure")}
NOTEBOOK_PACKAGES = ("ipywidgets", "plotly", "matplotlib", "IPython", "anywidget", "rectoolkit.viz", "rectoolkit.widgets")
SHARDING = ("rectoolkit.distributed", "rectoolkit.plan", "rectoolkit.planner", "rectoolkit.quant")


def module_imports(source: str, module: str):
    """(line, imported module) for every import statement, at any depth (relative ones resolved)."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.lineno, node.module


def _top(name: str) -> str:
    """The layer of a module: its package under rectoolkit (or a MODULE_LAYERS entry)."""
    for module, layer in MODULE_LAYERS.items():
        if name == module or name.startswith(module + "."):
            return layer
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "rectoolkit" else "__init__"


def layering_violations(sources):
    """Broken rules, one line each, for {module name: source text}."""
    found = []
    for module, source in sorted(sources.items()):
        if module in rectoolkit.compat.PATH_MODULES:
            continue
        mine = _top(module)
        for line, imported in module_imports(source, module):
            where = f"{module}:{line} imports {imported}"
            target = _top(imported) if imported == "rectoolkit" or imported.startswith("rectoolkit.") else None
            if mine not in ("viz", "widgets") and imported.startswith(NOTEBOOK_PACKAGES):
                found.append(f"{where}: the core never imports notebook code")
            if target is None:
                continue
            if mine == "sparse" and target not in ("sparse", "fbgemm_probe", "streamable"):
                found.append(f"{where}: sparse imports only sparse and the bottom layers (rectoolkit.fbgemm_probe, "
                             "rectoolkit.streamable)")
            if mine == "plan" and target == "planner":
                found.append(f"{where}: a plan never knows how it was made (no planner imports in plan/)")
            if mine == "launch" and imported.startswith(SHARDING):
                found.append(f"{where}: launch knows nothing of sharding")
            if LAYERS.index(target) > LAYERS.index(mine) and (module, imported) not in MEASURE_CALLERS:
                found.append(f"{where}: {mine} sits below {target} (layers, bottom up: {LAYERS})")
    return found


def _package_sources():
    sources = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = ("rectoolkit",) + path.relative_to(PACKAGE_ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text()
    return sources


def test_every_package_is_in_a_layer():
    sources = _package_sources()
    assert {_top(name) for name in sources} <= set(LAYERS), sorted({_top(n) for n in sources} - set(LAYERS))


def test_imports_point_down_the_layers():
    assert layering_violations(_package_sources()) == []


@pytest.mark.parametrize("module, planted, rule", [
    ("rectoolkit.sparse.jagged_ops", "def f():\n    from rectoolkit.kernels import fbgemm_available\n", "sparse imports only"),
    ("rectoolkit.plan.serialization", "def f():\n    import rectoolkit.planner.tables\n", "a plan never knows"),
    ("rectoolkit.modules.layout", "def f():\n    import plotly.graph_objects\n", "never imports notebook code"),
    ("rectoolkit.distributed.comm", "from rectoolkit.widgets import board\n", "never imports notebook code"),
    ("rectoolkit.launch.job", "from rectoolkit.distributed.comm import ShardingEnv\n", "launch knows nothing of sharding"),
    ("rectoolkit.kernels.id_ranges", "from ..modules import layout\n", "kernels sits below modules"),
    ("rectoolkit.planner.cost", "def f():\n    from rectoolkit.planner.measure import measure_plans\n",
     "planner sits below measure"),
])
def test_a_planted_bad_import_is_caught(module, planted, rule):
    sources = _package_sources()
    assert layering_violations(sources) == []
    sources[module] += "\n" + planted
    found = layering_violations(sources)
    assert len(found) >= 1 and all(module in line for line in found) and any(rule in line for line in found), found


def test_path_modules_only_reexport():
    """What rectoolkit.compat declares as path modules holds imports, a docstring and __all__, nothing else."""
    sources = _package_sources()
    for module in rectoolkit.compat.PATH_MODULES:
        body = ast.parse(sources[module]).body
        kinds = {type(node).__name__ for node in body[1:]}
        assert kinds <= {"Import", "ImportFrom", "Assign"}, (module, kinds)
        assert all(node.targets[0].id == "__all__" for node in body if isinstance(node, ast.Assign)), module
