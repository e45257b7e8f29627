"""Synthetic click data for demos: Zipf-distributed ids, per-feature pooling factors, learnable labels.

    >>> import rectoolkit as rtk
    >>> data = SyntheticData(tables=[rtk.EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=8,
    ...                                                     feature_names=["f"])],
    ...                      pooling_factors={"f": 3.0}, batch_size=4, dense_features=2, seed=0)
    >>> dense, sparse, labels = data.batch(step=0)
    >>> dense.shape, sparse.keys(), sparse.stride(), labels.shape
    (torch.Size([4, 2]), ['f'], 4, torch.Size([4]))

Labels come from a hidden "true" model so that a DLRM can learn them: every (feature, id) has a fixed score
in [-1, 1] (an integer hash of the id, no table needed), the dense features have fixed weights, and
P(click) = sigmoid(signal * (dense . w + c * mean over features of the bag's mean id score) / sqrt(2)), the
sparse part twice as strong as the dense part. Hot ids (Zipf)
repeat often, so their embeddings learn their scores; the loss falls and the AUC rises.

Determinism: the batch of (seed, step, rank) is the same wherever it is generated, and the global batch of a
step is the concatenation of the ranks' batches in rank order (`global_batch`), so a W-rank run sees exactly
the samples of a 1-process run with W times the batch.
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence

import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.sparse import KeyedJaggedTensor
from rectoolkit.streamable import Pipelineable

_MASK32 = 0xFFFFFFFF


class Batch(NamedTuple):
    """One batch: dense features [B, dense_in] (float), sparse features (KJT, stride B), labels [B] (0./1.)."""

    dense_features: torch.Tensor
    sparse_features: KeyedJaggedTensor
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        """The batch on `device` (TorchRec's `Batch.to`)."""
        return Batch(self.dense_features.to(device, non_blocking=non_blocking),
                     self.sparse_features.to(device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "Batch":
        """The batch in pinned host memory, for faster copies to a GPU (TorchRec's `Batch.pin_memory`)."""
        return Batch(self.dense_features.pin_memory(), self.sparse_features.pin_memory(), self.labels.pin_memory())

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        """Mark every tensor as used on `stream` (TorchRec's `Batch.record_stream`)."""
        self.dense_features.record_stream(stream)
        self.sparse_features.record_stream(stream)
        self.labels.record_stream(stream)


Pipelineable.register(Batch)  # TorchRec's Batch subclasses it


def hash_unit(ids: torch.Tensor, salt) -> torch.Tensor:
    """A fixed pseudo-random value in [-1, 1) for every (id, salt): a 32-bit integer hash, no storage.

    `salt` is an int or a tensor shaped like `ids` (one salt per feature, for all features at once).
    """
    h = (ids.to(torch.int64) * 2654435761 + salt * 40503 + 12345) & _MASK32
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & _MASK32
    h = ((h ^ (h >> 16)) * 0x45D9F3B) & _MASK32
    h = h ^ (h >> 16)
    return h.to(torch.float64) / 2**31 - 1.0


def _coprime_multiplier(num_rows: int, salt: int) -> int:
    """A multiplier coprime with num_rows, so rank -> (rank * m + c) % num_rows is a bijection."""
    candidates = [2654435761, 40503, 97, 1000003, 7919, 104729, 15485863, 32452843]
    for multiplier in candidates[salt % len(candidates):] + candidates[: salt % len(candidates)]:
        if math.gcd(multiplier, num_rows) == 1:
            return multiplier % num_rows or 1
    return 1


_ZIPF_HEAD = 4096  # the most popular ids are sampled exactly; the rare tail from the continuous power law


def _zipf(u: torch.Tensor, num_rows: torch.Tensor, multiplier: torch.Tensor, salt: torch.Tensor,
          alpha: float) -> torch.Tensor:
    """Uniform u in [0, 1) -> Zipf ids; num_rows, multiplier, salt are per-value int64 tensors.

    Popularity rank k (0-based) has weight (k + 1) ** -alpha: exactly for k < 4096 (a cumulative table),
    and for rarer ranks by inverting the integral of x ** -alpha over [k + 1/2, k + 3/2), which is within
    0.1% of it there. Then rank -> id by a fixed bijection of the table's rows.
    """
    if alpha == 0:
        rank = torch.floor(u * num_rows.to(torch.float64)).to(torch.int64)
    else:
        head_weights = torch.arange(1, _ZIPF_HEAD + 1, dtype=torch.float64).pow(-alpha)
        head_cumsum = torch.cumsum(head_weights, 0)
        head_size = num_rows.clamp(max=_ZIPF_HEAD)
        head_mass = head_cumsum[head_size - 1]
        start = _ZIPF_HEAD + 0.5
        end = num_rows.to(torch.float64) + 0.5
        if abs(alpha - 1.0) < 1e-9:
            tail_mass = torch.log(end / start)
        else:
            tail_mass = (end.pow(1.0 - alpha) - start ** (1.0 - alpha)) / (1.0 - alpha)
        tail_mass = torch.where(num_rows > _ZIPF_HEAD, tail_mass, torch.zeros_like(tail_mass))
        mass = u * (head_mass + tail_mass)
        head_rank = torch.searchsorted(head_cumsum, mass, right=True)
        beyond = (mass - head_mass).clamp(min=0)
        if abs(alpha - 1.0) < 1e-9:
            x = start * torch.exp(beyond)
        else:
            x = (start ** (1.0 - alpha) + beyond * (1.0 - alpha)).pow(1.0 / (1.0 - alpha))
        tail_rank = torch.floor(x - 0.5).to(torch.int64)
        rank = torch.where(mass < head_mass, head_rank, tail_rank)
    rank = torch.minimum(rank.clamp_(min=0), num_rows - 1)
    return (rank * multiplier + 7 * salt) % num_rows


def zipf_ids(num_samples: int, num_rows: int, alpha: float, generator: torch.Generator, salt: int = 0) -> torch.Tensor:
    """`num_samples` ids in [0, num_rows) with P(k-th most popular id) ~ 1 / k**alpha (alpha=0: uniform).

    The 4096 most popular ranks are sampled exactly, the rest from the continuous power law (O(1) memory
    even for huge tables); the popularity order is scattered over the rows by a fixed bijection, so the hot
    ids are not all in the first rows.
    """
    u = torch.rand(num_samples, generator=generator, dtype=torch.float64)
    full = lambda value: torch.full((num_samples,), value, dtype=torch.int64)  # noqa: E731
    return _zipf(u, full(num_rows), full(_coprime_multiplier(num_rows, salt)), full(salt), alpha)


def bag_lengths(num_samples: int, pooling_factor: float, generator: torch.Generator) -> torch.Tensor:
    """Ids per sample with mean `pooling_factor`: 1 + Poisson(pf - 1) for pf >= 1, else Bernoulli(pf)."""
    if pooling_factor >= 1:
        rates = torch.full((num_samples,), float(pooling_factor) - 1.0)
        return (1 + torch.poisson(rates, generator=generator)).to(torch.int64)
    return (torch.rand(num_samples, generator=generator) < pooling_factor).to(torch.int64)


class SyntheticData:
    """Deterministic synthetic click batches for one rank of `world_size` (see the module docstring).

    Args:
        tables: the EmbeddingBagConfigs (ids of each feature are drawn in [0, its table's num_embeddings)).
        pooling_factors: feature -> mean ids per sample (default 1.0 for features not listed).
        batch_size: samples per rank per step.
        dense_features: number of dense features (N(0, 1) values).
        zipf_alpha: id popularity skew (0 = uniform; Criteo-like ~1.05).
        signal: how strongly labels depend on the features (larger = easier, higher reachable AUC).
        seed, rank, world_size: which stream of batches this is.
    """

    def __init__(self, tables: Sequence[EmbeddingBagConfig], pooling_factors: Optional[Dict[str, float]] = None,
                 batch_size: int = 128, dense_features: int = 13, zipf_alpha: float = 1.05, signal: float = 3.0,
                 seed: int = 0, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.tables = list(tables)
        self.features: List[str] = [f for t in self.tables for f in t.feature_names]
        self.num_rows: List[int] = [t.num_embeddings for t in self.tables for _ in t.feature_names]
        pooling_factors = dict(pooling_factors or {})
        self.pooling_factors = [float(pooling_factors.get(f, 1.0)) for f in self.features]
        self.batch_size = batch_size
        self.dense_features = dense_features
        self.zipf_alpha = zipf_alpha
        self.signal = signal
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self._rows = torch.tensor(self.num_rows, dtype=torch.int64)
        self._multipliers = torch.tensor([_coprime_multiplier(rows, index) for index, rows in enumerate(self.num_rows)],
                                         dtype=torch.int64)
        weights = torch.Generator().manual_seed(seed * 7919 + 17)
        self.dense_weights = torch.randn(dense_features, generator=weights, dtype=torch.float64)
        if dense_features:
            self.dense_weights /= 2 * math.sqrt(dense_features)

    @staticmethod
    def from_workload(workload, batch_size: Optional[int] = None, **kwargs) -> "SyntheticData":
        """SyntheticData for a rectoolkit Workload (its tables, pooling factors, dense features, id skew)."""
        alpha = 0.0
        if workload.id_distribution.get("kind") == "zipf":
            alpha = float(workload.id_distribution.get("alpha", 1.05))
        kwargs.setdefault("zipf_alpha", alpha)
        kwargs.setdefault("dense_features", workload.dense_features)
        return SyntheticData(workload.tables, workload.pooling_factors,
                             batch_size or workload.batch_size_per_rank, **kwargs)

    def _generator(self, step: int, rank: int) -> torch.Generator:
        return torch.Generator().manual_seed(((self.seed * 1_000_003 + step) * 65_537 + rank) & (2**62 - 1))

    def batch(self, step: int, rank: Optional[int] = None) -> Batch:
        """This rank's batch of `step` (or another rank's, with `rank=`)."""
        generator = self._generator(step, self.rank if rank is None else rank)
        size, num_features = self.batch_size, len(self.features)
        dense = torch.randn(size, self.dense_features, generator=generator, dtype=torch.float64)
        logit = dense @ self.dense_weights if self.dense_features else torch.zeros(size, dtype=torch.float64)
        lengths = torch.cat([bag_lengths(size, pf, generator) for pf in self.pooling_factors] or
                            [torch.zeros(0, dtype=torch.int64)])
        # all features at once: per value, its feature's rows, multiplier and salt
        ids_per_feature = lengths.view(num_features, size).sum(1) if num_features else lengths
        per_value = lambda column: torch.repeat_interleave(column, ids_per_feature)  # noqa: E731
        feature_of_value = per_value(torch.arange(num_features))
        u = torch.rand(len(feature_of_value), generator=generator, dtype=torch.float64)
        ids = _zipf(u, per_value(self._rows), per_value(self._multipliers), feature_of_value, self.zipf_alpha)
        if num_features:
            scores = hash_unit(ids, feature_of_value + 1)
            bag_of_value = torch.repeat_interleave(torch.arange(num_features * size), lengths)
            bag_sum = torch.zeros(num_features * size, dtype=torch.float64).index_add_(0, bag_of_value, scores)
            bag_mean = (bag_sum / lengths.clamp(min=1)).view(num_features, size)
            # a bag mean of one id has std 1/sqrt(3): scale the sparse part to std ~1, twice the dense part's
            logit = logit + bag_mean.mean(0) * math.sqrt(3.0 * num_features)
        probability = torch.sigmoid(self.signal * logit / math.sqrt(2.0))
        labels = (torch.rand(size, generator=generator, dtype=torch.float64) < probability).to(torch.float32)
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=list(self.features), values=ids, lengths=lengths)
        return Batch(dense.to(torch.float32), sparse, labels)

    def global_batch(self, step: int) -> Batch:
        """The whole step's batch: every rank's batch concatenated in rank order (for checking sharded runs)."""
        parts = [self.batch(step, rank) for rank in range(self.world_size)]
        return Batch(torch.cat([p.dense_features for p in parts]),
                     _concat_batches([p.sparse_features for p in parts]),
                     torch.cat([p.labels for p in parts]))

    def __iter__(self) -> Iterator[Batch]:
        step = 0
        while True:
            yield self.batch(step)
            step += 1


def _concat_batches(parts: Sequence[KeyedJaggedTensor]) -> KeyedJaggedTensor:
    """Stack KJTs with the same keys along the batch: per key, the bags of part 0, then part 1, ..."""
    keys = parts[0].keys()
    values, lengths = [], []
    for key in keys:
        for part in parts:
            jagged = part[key]
            values.append(jagged.values())
            lengths.append(jagged.lengths())
    return KeyedJaggedTensor.from_lengths_sync(keys=list(keys), values=torch.cat(values), lengths=torch.cat(lengths))
