"""The jagged data types: JaggedTensor, KeyedJaggedTensor, KeyedTensor (TorchRec-compatible)."""

from rectoolkit.sparse.jagged_tensor import JaggedTensor
from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from rectoolkit.sparse.keyed_tensor import KeyedTensor
from rectoolkit.streamable import Pipelineable
from rectoolkit.sparse import conversions, jagged_tensor_validator  # noqa: F401 (TorchRec's paths)
from rectoolkit.sparse.validation import (
    set_validation_enabled,
    validation_disabled,
    validation_enabled,
)

__all__ = [
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "set_validation_enabled",
    "validation_disabled",
    "validation_enabled",
]

for _pipelineable in (JaggedTensor, KeyedJaggedTensor, KeyedTensor):  # TorchRec's subclass Pipelineable
    Pipelineable.register(_pipelineable)
