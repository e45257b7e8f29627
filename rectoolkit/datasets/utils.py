"""`Batch` at TorchRec's path (`torchrec.datasets.utils`): dense_features, sparse_features (a KJT), labels."""

from rectoolkit.train.data import Batch

__all__ = ["Batch"]
