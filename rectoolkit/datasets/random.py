"""`RandomRecDataset` (TorchRec's `torchrec.datasets.random`): an endless or fixed-length stream of random
`Batch`es, uniform ids per feature, for smoke tests and benchmarks; nothing to download.

    >>> dataset = RandomRecDataset(keys=["user", "item"], batch_size=4, hash_size=100, ids_per_feature=2,
    ...                            num_dense=3, manual_seed=0, num_batches=5)
    >>> batch = next(iter(dataset))
    >>> batch.dense_features.shape, batch.sparse_features.keys(), batch.sparse_features.lengths().tolist()
    (torch.Size([4, 3]), ['user', 'item'], [2, 2, 2, 2, 2, 2, 2, 2])
    >>> len(dataset), len(list(dataset))
    (5, 5)

TorchRec's semantics, kept so a seeded stream is the same batch for batch: a feature's bag lengths are drawn
uniformly in [min_ids, ids] (with `ids_per_feature` given and no minimum, every bag has exactly that many
ids); `num_generated_batches` batches are drawn once and then cycled (0 or less: a fresh batch every step);
labels are 0/1 integers.
"""

from __future__ import annotations

import itertools
from typing import Iterator, List, Optional

import torch
from torch.utils.data import IterableDataset

from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from rectoolkit.train.data import Batch


def _per_key(name: str, keys: List[str], each: Optional[int], per_key: Optional[List[int]], default: int) -> List[int]:
    """`per_key` as given, else `each` (or `default`) for every key; a list of the wrong length is refused."""
    if per_key is None:
        return [each if each is not None else default] * len(keys)
    if len(per_key) != len(keys):
        raise ValueError(f"RandomRecDataset: {name} has {len(per_key)} entries but there are {len(keys)} keys "
                         f"{keys}; give one per key")
    return list(per_key)


class RandomRecDataset(IterableDataset):
    """Random batches: `sparse_features` over `keys` with stride `batch_size`, `dense_features`
    [batch_size, num_dense], `labels` [batch_size] in {0, 1}. `num_batches=None` streams forever."""

    def __init__(self, keys: List[str], batch_size: int, hash_size: Optional[int] = None,
                 hash_sizes: Optional[List[int]] = None, ids_per_feature: Optional[int] = None,
                 ids_per_features: Optional[List[int]] = None, num_dense: int = 50, manual_seed: Optional[int] = None,
                 num_batches: Optional[int] = None, num_generated_batches: int = 10,
                 min_ids_per_feature: Optional[int] = None, min_ids_per_features: Optional[List[int]] = None) -> None:
        super().__init__()
        if batch_size <= 0:
            raise ValueError(f"RandomRecDataset: batch_size={batch_size} must be positive")
        self.keys = list(keys)
        self.batch_size = batch_size
        self.hash_sizes = _per_key("hash_sizes", self.keys, hash_size, hash_sizes, default=100)
        self.ids_per_features = _per_key("ids_per_features", self.keys, ids_per_feature, ids_per_features, default=2)
        if min_ids_per_feature is None and min_ids_per_features is None:
            min_ids_per_feature = ids_per_feature  # TorchRec's rule: a fixed bag length when only it is given
        self.min_ids_per_features = _per_key("min_ids_per_features", self.keys, min_ids_per_feature,
                                             min_ids_per_features, default=0)
        for key, low, high, rows in zip(self.keys, self.min_ids_per_features, self.ids_per_features, self.hash_sizes):
            if not 0 <= low <= high or rows <= 0:
                raise ValueError(f"RandomRecDataset: feature {key!r} has ids per bag in [{low}, {high}] and "
                                 f"hash size {rows}; need 0 <= min <= max and a positive hash size")
        self.num_dense = num_dense
        self.num_batches = num_batches
        self.generator = torch.Generator().manual_seed(manual_seed) if manual_seed is not None else None
        self.num_generated_batches = num_generated_batches
        self._generated = [self._generate_batch() for _ in range(max(num_generated_batches, 0))]

    def _generate_batch(self) -> Batch:
        values, lengths = [], []
        for rows, low, high in zip(self.hash_sizes, self.min_ids_per_features, self.ids_per_features):
            key_lengths = torch.randint(low, high + 1, (self.batch_size,), dtype=torch.int32, generator=self.generator)
            values.append(torch.randint(0, rows, (int(key_lengths.sum()),), generator=self.generator))
            lengths.append(key_lengths)
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=torch.cat(values),
                                                     lengths=torch.cat(lengths))
        dense = torch.randn(self.batch_size, self.num_dense, generator=self.generator)
        labels = torch.randint(0, 2, (self.batch_size,), generator=self.generator)
        return Batch(dense_features=dense, sparse_features=sparse, labels=labels)

    def _batches(self) -> Iterator[Batch]:
        if self._generated:
            return itertools.cycle(self._generated)
        return (self._generate_batch() for _ in itertools.count())

    def __iter__(self) -> Iterator[Batch]:
        return itertools.islice(self._batches(), self.num_batches)

    def __len__(self) -> int:
        if self.num_batches is None:
            raise TypeError("RandomRecDataset: num_batches=None streams forever and has no length; "
                            "pass num_batches to get one")
        return self.num_batches
