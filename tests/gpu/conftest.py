"""The `gpu` tests (each module is marked `gpu`; tests/conftest.py says how they skip without CUDA)."""

import pytest
import torch

from gpu_helpers import gpu_device


@pytest.fixture
def device() -> torch.device:
    return gpu_device()
