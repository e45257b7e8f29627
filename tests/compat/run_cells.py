"""Run a tutorial script cell by cell ("# %%" separators) with `torchrec` module paths mapped to rectoolkit.

    python run_cells.py SCRIPT RESULT_JSON

Each cell runs in one shared namespace; a failing cell is recorded (its traceback) and the next cells still run,
as in a notebook. RESULT_JSON gets [{"cell": i, "ok": bool, "error": str, "stdout": str}, ...]. The fixed
MASTER_PORT of the tutorial is replaced by a free port (several test runs may share the machine).
"""

import contextlib
import importlib
import importlib.abc
import importlib.util
import io
import json
import socket
import sys
import traceback


class TorchrecToRectoolkit(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import torchrec.x.y` gives the module rectoolkit.x.y (the same object, under both names)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torchrec" and not fullname.startswith("torchrec."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module("rectoolkit" + spec.name[len("torchrec"):])

    def exec_module(self, module):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def main(script: str, result_path: str) -> None:
    sys.meta_path.insert(0, TorchrecToRectoolkit())
    cells = open(script).read().split("\n# %%\n")[1:]
    port = str(free_port())
    namespace = {"__name__": "__main__"}
    results = []
    for index, source in enumerate(cells):
        source = source.replace('"29500"', f'"{port}"')
        out = io.StringIO()
        error = ""
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(source, f"cell {index + 1}", "exec"), namespace)
        except Exception:
            error = traceback.format_exc()
        results.append({"cell": index + 1, "ok": not error, "error": error, "stdout": out.getvalue()})
    with open(result_path, "w") as f:
        json.dump(results, f)
    import torch.distributed as dist

    if dist.is_initialized():  # the tutorial's group: leave nothing behind
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
