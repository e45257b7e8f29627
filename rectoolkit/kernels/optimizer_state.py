"""Embedding optimizers (fbgemm's names) and the size of their state per table, for the planner.

    >>> optimizer_state_bytes(EmbOptimType.ROWWISE_ADAGRAD, num_rows=1000, embedding_dim=64)
    4000
    >>> optimizer_state_bytes("adam", num_rows=10, embedding_dim=4)
    320
"""

from __future__ import annotations

import enum
from typing import Union


@enum.unique
class EmbOptimType(enum.Enum):
    """Optimizers that can be fused into an embedding lookup's backward (values as in fbgemm/TorchRec)."""

    SGD = "sgd"  # fbgemm's EXACT_SGD
    ADAGRAD = "adagrad"  # fbgemm's EXACT_ADAGRAD: one accumulator per element
    ROWWISE_ADAGRAD = "row_wise_adagrad"  # fbgemm's EXACT_ROWWISE_ADAGRAD: one accumulator per row
    ADAM = "adam"  # two moments per element

    @classmethod
    def parse(cls, value: Union["EmbOptimType", str]) -> "EmbOptimType":
        """Accept a member, its value, its name, or fbgemm's EXACT_* spelling."""
        if isinstance(value, cls):
            return value
        text = str(value).strip().lower()
        if text.startswith("exact_"):
            text = text[len("exact_"):]
        aliases = {"rowwise_adagrad": "row_wise_adagrad", "row-wise adagrad": "row_wise_adagrad"}
        text = aliases.get(text, text)
        for member in cls:
            if text in (member.value, member.name.lower()):
                return member
        raise ValueError(f"unknown embedding optimizer {value!r}; use one of {[m.value for m in cls]}")


# fp32 state values per row, as a function of the embedding dimension.
_STATE_FLOATS_PER_ROW = {
    EmbOptimType.SGD: lambda dim: 0,
    EmbOptimType.ADAGRAD: lambda dim: dim,
    EmbOptimType.ROWWISE_ADAGRAD: lambda dim: 1,
    EmbOptimType.ADAM: lambda dim: 2 * dim,
}


def optimizer_state_floats_per_row(optimizer: Union[EmbOptimType, str], embedding_dim: int) -> int:
    """Number of fp32 optimizer-state values kept per embedding row."""
    return _STATE_FLOATS_PER_ROW[EmbOptimType.parse(optimizer)](embedding_dim)


def optimizer_state_bytes(optimizer: Union[EmbOptimType, str], num_rows: int, embedding_dim: int) -> int:
    """Bytes of optimizer state for a (shard of a) table of num_rows x embedding_dim."""
    return 4 * num_rows * optimizer_state_floats_per_row(optimizer, embedding_dim)
