"""Suite-wide checks. Under CI=true the optional comparisons must really run: TorchRec and fbgemm-gpu-cpu are
installed by `make test`, so a missing one is a broken environment, not a reason to skip."""

from __future__ import annotations

import importlib
import os

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("CI", "").lower() != "true":
        return
    for name in ("torchrec", "fbgemm_gpu"):
        try:
            importlib.import_module(name)
        except Exception as error:  # ImportError, or fbgemm's OSError on a wrong torch
            raise pytest.UsageError(f"CI=true but {name} does not import ({error!r}); "
                                    f"`make test` installs it from constraints.txt: rerun `make clean test`") from error


# ------------------------------------------------------------------------------------------------ gpu marker
# Tests marked `gpu` run on the visible CUDA device (`make test-gpu`, docs/gpu.md). Without one they are
# skipped, all for one reason, reported on one line. RECTOOLKIT_GPU_DRY_RUN=1 runs them on the CPU instead,
# to check the test code itself on a machine without a GPU (it proves nothing about CUDA; the checks that
# need CUDA itself skip, saying so).
NO_CUDA_REASON = ("no CUDA device visible (torch.cuda.is_available() is False): the `gpu` tests run with "
                  "`make test-gpu` (or `bash .ci/gpu`) on a GPU machine, see docs/gpu.md")


def gpu_dry_run() -> bool:
    return os.environ.get("RECTOOLKIT_GPU_DRY_RUN", "") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    import torch

    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or torch.cuda.is_available() or gpu_dry_run():
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))
    config._rectoolkit_gpu_skipped = len(gpu_items)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    skipped = getattr(config, "_rectoolkit_gpu_skipped", 0)
    if skipped:
        terminalreporter.write_line(f"gpu: {skipped} tests skipped: {NO_CUDA_REASON}")
