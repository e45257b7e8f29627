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
