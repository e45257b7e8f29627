"""The examples in rectoolkit.distributed's docstrings run (world size 1, no process group)."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["comm", "sharded_ebc", "sharded_ec", "state", "sharders", "awaitable"])
def test_docstring_examples(name):
    module = importlib.import_module(f"rectoolkit.distributed.{name}")
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0, result
