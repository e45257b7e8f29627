"""Keyed optimizers (TorchRec's KeyedOptimizer, CombinedOptimizer, and the wrappers WarmupOptimizer and
GradientClippingOptimizer), the fused embedding optimizer, RowWiseAdagrad, and TorchRec's names of the fused
optimizers (SGD, Adagrad, Adam, ...: rectoolkit.optim.optimizers)."""

from rectoolkit.optim.fused import EmbeddingFusedOptimizer, FusedOptimizer, FusedOptimizerModule
from rectoolkit.optim.keyed import (
    CombinedOptimizer,
    KeyedOptimizer,
    KeyedOptimizerWrapper,
    OptimizerWrapper,
    in_backward_optimizer_filter,
)
from rectoolkit.optim.warmup import WarmupOptimizer, WarmupPolicy, WarmupStage
from rectoolkit.optim.clipping import GradientClipping, GradientClippingOptimizer
from rectoolkit.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from rectoolkit.optim.optimizers import LAMB, SGD, Adagrad, Adam, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB
from rectoolkit.optim.rowwise_adagrad import RowWiseAdagrad
