"""Datasets at TorchRec's paths (`torchrec.datasets`): `RandomRecDataset`, and the `Batch` they yield."""

from rectoolkit.datasets.random import RandomRecDataset
from rectoolkit.datasets.utils import Batch

__all__ = ["Batch", "RandomRecDataset"]
