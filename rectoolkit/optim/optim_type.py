"""TorchRec's OptimType (torchrec.distributed.embedding_types.OptimType): the names of embedding optimizers, as
TorchRec lists them (its own enum, not fbgemm's EmbOptimType; rectoolkit's fused kernels take the optimizers named
in rectoolkit.kernels.fused_optimizers).

    >>> OptimType("ROWWISE_ADAGRAD").name
    'ROWWISE_ADAGRAD'
"""

from enum import Enum, unique

__all__ = ["OptimType"]


@unique
class OptimType(Enum):
    SGD = "SGD"
    LARS_SGD = "LARS_SGD"
    LAMB = "LAMB"
    PARTIAL_ROWWISE_LAMB = "PARTIAL_ROWWISE_LAMB"
    ADAM = "ADAM"
    PARTIAL_ROWWISE_ADAM = "PARTIAL_ROWWISE_ADAM"
    ADAGRAD = "ADAGRAD"
    ROWWISE_ADAGRAD = "ROWWISE_ADAGRAD"
    SHAMPOO = "SHAMPOO"
    SHAMPOO_V2 = "SHAMPOO_V2"
    LION = "LION"
    ADAMW = "ADAMW"
    SHAMPOO_V2_MRS = "SHAMPOO_V2_MRS"
    SHAMPOO_MRS = "SHAMPOO_MRS"
    MUON = "MUON"
    SHAMPOO_V3_MRS = "SHAMPOO_V3_MRS"
