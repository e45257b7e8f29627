"""What the `gpu` tests share: the device they run on, and the dry run on CPU (tests/conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
for _folder in ("distributed", "quant"):  # the CPU suite's workers (dist_harness, dist_workers, quant_dist_workers)
    sys.path.insert(0, str(REPO / "tests" / _folder))


def dry_run() -> bool:
    """RECTOOLKIT_GPU_DRY_RUN=1: run the gpu tests on the CPU, to check the test code without a GPU."""
    return os.environ.get("RECTOOLKIT_GPU_DRY_RUN", "") == "1"


def gpu_device() -> torch.device:
    return torch.device("cpu") if dry_run() else torch.device("cuda", 0)


def needs_cuda_itself(what: str) -> None:
    """Skip in the dry run a check that only means something on CUDA (pinned memory, streams, NCCL)."""
    if dry_run():
        pytest.skip(f"RECTOOLKIT_GPU_DRY_RUN=1 runs on the CPU; {what} needs a CUDA device")


def needs_gpus(count: int, why: str) -> None:
    """The one allowed skip on a GPU machine: a test that needs more GPUs than are visible."""
    visible = 0 if dry_run() else torch.cuda.device_count()
    if visible < count:
        pytest.skip(f"needs {count} CUDA devices ({why}); {visible} visible")
