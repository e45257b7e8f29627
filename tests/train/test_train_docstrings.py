"""The docstring examples of rectoolkit.train and rectoolkit.launch run as written."""

import doctest
import importlib

import pytest

MODULES = ["rectoolkit.train.data", "rectoolkit.train.metrics", "rectoolkit.train.criteo", "rectoolkit.train.model",
           "rectoolkit.launch.context", "rectoolkit.launch.job"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
