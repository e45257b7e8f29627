"""Workload statistics the cost model needs: mean ids per sample of each feature, and the batch size.

Measured from a few sample KeyedJaggedTensor batches, or taken from a public workload.

    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> import torch
    >>> kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(6), lengths=torch.tensor([1, 3, 2, 0]))
    >>> stats = WorkloadStats.from_batches([kjt])
    >>> stats.pooling_factors, stats.batch_size
    ({'a': 2.0, 'b': 1.0}, 2)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

_LOG = logging.getLogger("rectoolkit.planner")


@dataclass
class WorkloadStats:
    """Mean ids per sample per feature (pooling factors) and samples per rank per step."""

    pooling_factors: Dict[str, float] = field(default_factory=dict)
    batch_size: Optional[int] = None
    is_weighted: bool = False

    @classmethod
    def from_batches(cls, batches: Iterable[object]) -> "WorkloadStats":
        """Average over sample batches (any objects with KeyedJaggedTensor's keys()/lengths()/stride())."""
        id_totals: Dict[str, float] = {}
        sample_totals: Dict[str, int] = {}
        batch_sizes = []
        weighted = False
        for kjt in batches:
            stride = int(kjt.stride())
            batch_sizes.append(stride)
            lengths = kjt.lengths().reshape(len(kjt.keys()), stride) if stride else None
            weighted = weighted or kjt.weights_or_none() is not None
            for index, key in enumerate(kjt.keys()):
                total = float(lengths[index].sum()) if lengths is not None else 0.0
                id_totals[key] = id_totals.get(key, 0.0) + total
                sample_totals[key] = sample_totals.get(key, 0) + stride
        if not batch_sizes:
            raise ValueError("WorkloadStats.from_batches: no batches given; pass at least one KeyedJaggedTensor")
        factors = {key: id_totals[key] / sample_totals[key] if sample_totals[key] else 0.0 for key in id_totals}
        return cls(pooling_factors=factors, batch_size=max(batch_sizes), is_weighted=weighted)

    @classmethod
    def from_workload(cls, workload: object) -> "WorkloadStats":
        """From a `rectoolkit.load_workload(...)` Workload."""
        return cls(pooling_factors=dict(workload.pooling_factors), batch_size=int(workload.batch_size_per_rank))


def measure_pooling_factors(batches: Iterable[object]) -> Dict[str, float]:
    """Mean ids per sample of each feature over sample KJT batches."""
    return WorkloadStats.from_batches(batches).pooling_factors


class EmbeddingStats:
    """TorchRec's planner statistics printer, for EmbeddingShardingPlanner(stats=EmbeddingStats()): after each plan
    it logs the plan (each table's sharding type, kernel, ranks and shards, as ShardingPlan prints) and the
    planner's explanation of it (`planner.explain()`: the step estimate and its terms) to the logger
    "rectoolkit.planner" at INFO, where TorchRec logs its stats table. The text is rectoolkit's, not TorchRec's
    table."""

    def log_plan(self, planner: Any) -> None:
        _LOG.info("%s\n%s", planner.last.plan, planner.explain())


class NoopEmbeddingStats(EmbeddingStats):
    """TorchRec's silent statistics printer: logs nothing."""

    def log_plan(self, planner: Any) -> None:
        return None


def split_planner_stats(stats: Any) -> Tuple[Optional[WorkloadStats], List[EmbeddingStats]]:
    """EmbeddingShardingPlanner's `stats`: rectoolkit's WorkloadStats (what the cost model assumes), or TorchRec's
    use of the name, statistics printers (an EmbeddingStats / NoopEmbeddingStats, or a list of them)."""
    if stats is None or isinstance(stats, WorkloadStats):
        return stats, []
    printers = list(stats) if isinstance(stats, (list, tuple)) else [stats]
    wrong = [type(p).__name__ for p in printers if not isinstance(p, EmbeddingStats)]
    if wrong:
        raise TypeError(f"EmbeddingShardingPlanner: stats={wrong} is neither a WorkloadStats nor rectoolkit's "
                        "EmbeddingStats / NoopEmbeddingStats (rectoolkit.planner.stats, TorchRec's path "
                        "torchrec.distributed.planner.stats); pass one of those")
    return None, printers
