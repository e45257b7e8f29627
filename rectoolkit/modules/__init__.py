"""Embedding modules with TorchRec's names: table configs, EmbeddingBagCollection, EmbeddingCollection."""

from rectoolkit.modules.configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection


def __getattr__(name: str):
    """`rectoolkit.modules.embedding_configs` (TorchRec's path), imported on first use."""
    if name == "embedding_configs":
        import importlib

        return importlib.import_module("rectoolkit.modules.embedding_configs")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
