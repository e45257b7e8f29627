"""The examples in the docstrings of rectoolkit.quant run and print what they say."""

import doctest
import importlib
import warnings

import pytest

MODULES = [
    "rectoolkit.quant.config",
    "rectoolkit.quant.embedding_modules",
    "rectoolkit.quant.lookup",
    "rectoolkit.quant.rowwise",
    "rectoolkit.quant.sizes",
    "rectoolkit.quant.accuracy",
    "rectoolkit.quant.export",
    "rectoolkit.quant.pruning",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    import torch

    module = importlib.import_module(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.ao.quantization in the seed-001 example
        result = doctest.testmod(module, extraglobs={"torch": torch}, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0
