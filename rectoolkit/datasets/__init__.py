"""Datasets at TorchRec's paths (`torchrec.datasets`): `RandomRecDataset`, the Criteo readers (TSV rows, the
npy form and its in-memory batches) and MovieLens ratings, on local files; and the `Batch` they yield."""

from rectoolkit.datasets.criteo import (BinaryCriteoUtils, CriteoIterDataPipe, InMemoryBinaryCriteoIterDataPipe,
                                        criteo_kaggle, criteo_terabyte)
from rectoolkit.datasets.movielens import movielens_20m, movielens_25m
from rectoolkit.datasets.random import RandomRecDataset
from rectoolkit.datasets.utils import Batch

__all__ = ["Batch", "BinaryCriteoUtils", "CriteoIterDataPipe", "InMemoryBinaryCriteoIterDataPipe", "RandomRecDataset",
           "criteo_kaggle", "criteo_terabyte", "movielens_20m", "movielens_25m"]
