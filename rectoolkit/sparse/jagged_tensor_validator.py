"""TorchRec's KeyedJaggedTensor validator (torchrec.sparse.jagged_tensor_validator), for KJTs built with validation off.

rectoolkit checks every KeyedJaggedTensor it builds (rectoolkit.sparse.validation); inside `validation_disabled()`
or with `validate=False` it does not, and `validate_keyed_jagged_tensor` runs TorchRec's checks afterwards:
lengths and offsets agree with each other and with the values (sum of lengths == number of values: TorchRec's
validator does not accept padded values), keys are unique and divide the lengths, weights match the values. Those
raise ValueError. With `configs` (embedding configs: feature_names, num_embeddings) it also checks that every id
is in its table's range: out of range gives False and a logged warning, as TorchRec's does.

    >>> kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 5]), lengths=torch.tensor([2]))
    >>> validate_keyed_jagged_tensor(kjt)
    True
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence

import torch

from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor

__all__ = ["validate_keyed_jagged_tensor"]

logger = logging.getLogger(__name__)


def validate_keyed_jagged_tensor(kjt: KeyedJaggedTensor, configs: Optional[Sequence[Any]] = None) -> bool:
    """Raise ValueError for an inconsistent KJT; with `configs`, False (and a warning) for ids out of range."""
    lengths, offsets, values = kjt.lengths_or_none(), kjt.offsets_or_none(), kjt.values()
    if lengths is None and offsets is None:
        raise ValueError("lengths and offsets cannot be both empty in KeyedJaggedTensor")
    if lengths is not None:
        _check_lengths(lengths, values)
    if offsets is not None:
        _check_offsets(offsets, values)
    if lengths is not None and offsets is not None:
        if lengths.numel() != offsets.numel() - 1:
            raise ValueError(f"Expected lengths size to be 1 more than offsets size, but got lengths size: "
                             f"{lengths.numel()} and offsets size: {offsets.numel()}")
        if not lengths.equal(torch.diff(offsets)):
            raise ValueError("offsets is not equal to the cumulative sum of lengths")
    _check_keys(kjt, lengths.numel() if lengths is not None else offsets.numel() - 1)
    weights = kjt.weights_or_none()
    if weights is not None and weights.numel() != values.numel():
        raise ValueError(f"weights size must equal to values size, but got {weights.numel()} and {values.numel()}")
    return _ids_in_range(kjt, configs) if configs is not None else True


def _check_lengths(lengths: torch.Tensor, values: torch.Tensor) -> None:
    if lengths.sum().item() != values.numel():
        raise ValueError(f"Sum of lengths must equal the number of values, but got {lengths.sum().item()} and "
                         f"{values.numel()}")


def _check_offsets(offsets: torch.Tensor, values: torch.Tensor) -> None:
    if offsets.numel() == 0:
        raise ValueError("offsets cannot be empty")
    if offsets[0] != 0:
        raise ValueError(f"Expected first offset to be 0, but got {offsets[0]} instead")
    if offsets[-1] != values.numel():
        raise ValueError(f"The last element of offsets must equal to the number of values, but got {offsets[-1]} "
                         f"and {values.numel()}")


def _check_keys(kjt: KeyedJaggedTensor, num_lengths: int) -> None:
    keys = kjt.keys()
    if len(set(keys)) != len(keys):
        raise ValueError("keys must be unique")
    if not keys and num_lengths > 0:
        raise ValueError("keys is empty but lengths or offsets is not")
    if keys and not kjt.variable_stride_per_key() and num_lengths % len(keys):
        raise ValueError(f"lengths size must be divisible by keys size, but got {num_lengths} and {len(keys)}")
    if keys and kjt.variable_stride_per_key() and sum(kjt.stride_per_key()) != num_lengths:
        logger.warning(f"Sum of stride_per_key_per_rank ({sum(kjt.stride_per_key())}) must equal the number of "
                       f"lengths ({num_lengths}) for VBE KeyedJaggedTensor")


def _ids_in_range(kjt: KeyedJaggedTensor, configs: Sequence[Any]) -> bool:
    rows: Dict[str, int] = {feature: config.num_embeddings for config in configs for feature in config.feature_names}
    if not set(kjt.keys()) & set(rows) or kjt.lengths().numel() == 0:
        return True
    valid = True
    for feature, jt in kjt.to_dict().items():
        if feature not in rows or jt.values().numel() == 0:
            continue
        low, high = jt.values().min(), jt.values().max()
        if low < 0 or high >= rows[feature]:
            logger.warning(f"Feature {feature} has range {low.item(), high.item()} which is out of range "
                           f"{0, rows[feature]}")
            valid = False
    return valid
