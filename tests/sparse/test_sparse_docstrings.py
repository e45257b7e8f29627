"""The examples in the docstrings of rectoolkit.sparse run and print what they say."""

import doctest
import importlib

import pytest

MODULES = [
    "rectoolkit.sparse.jagged_ops",
    "rectoolkit.sparse.jagged_tensor",
    "rectoolkit.sparse.keyed_jagged_tensor",
    "rectoolkit.sparse.kjt_devices",
    "rectoolkit.sparse.kjt_keys",
    "rectoolkit.sparse.kjt_validation",
    "rectoolkit.sparse.keyed_tensor",
    "rectoolkit.sparse.fx_construct",
    "rectoolkit.sparse.validation",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    import torch

    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0
