"""Batched embedding lookup kernels and fused optimizers (fbgemm TBE when installed, pure torch otherwise)."""

from rectoolkit.kernels.backend import fbgemm_available
from rectoolkit.kernels.batched_embedding import (
    BatchedEmbeddingKernel,
    TableSpec,
    TorchBatchedEmbedding,
    choose_backend,
    make_batched_embedding,
)
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig, apply_row_update, init_optimizer_state
from rectoolkit.kernels.optimizer_state import (
    EmbOptimType,
    optimizer_state_bytes,
    optimizer_state_floats_per_row,
)
