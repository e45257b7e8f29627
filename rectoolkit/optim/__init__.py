"""Keyed optimizers (TorchRec's KeyedOptimizer, CombinedOptimizer) and the fused embedding optimizer."""

from rectoolkit.optim.fused import EmbeddingFusedOptimizer
from rectoolkit.optim.keyed import (
    CombinedOptimizer,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    in_backward_optimizer_filter,
)
from rectoolkit.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
