"""TorchRec's module path torchrec.distributed.planner.stats (a path module, see rectoolkit.compat); the
statistics printers are rectoolkit.planner.stats'."""

from rectoolkit.planner.stats import EmbeddingStats, NoopEmbeddingStats

__all__ = ["EmbeddingStats", "NoopEmbeddingStats"]
