"""Feature processors: learned per-position weights applied to a KJT's ids before pooling, with TorchRec's
names and state_dict keys (`torchrec.modules.feature_processor_`, the trailing underscore is TorchRec's).

A bag's j-th id gets the weight `position_weight[j]` (all ones at the start), so a weighted
EmbeddingBagCollection pools sum_j position_weight[j] * row(id_j): the model learns how much the most recent
items of a history count against the older ones.

    bag [7, 3, 9]   positions [0, 1, 2]   weights [w0, w1, w2]   pooled = w0 E[7] + w1 E[3] + w2 E[9]

    >>> import torch, rectoolkit as rtk
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["hist"], torch.tensor([7, 3, 9, 4]), torch.tensor([3, 1]))
    >>> module = PositionWeightedModuleCollection({"hist": 4})
    >>> with torch.no_grad():
    ...     _ = module.position_weights["hist"].copy_(torch.tensor([1.0, 0.5, 0.25, 0.125]))
    >>> module(kjt).weights()
    tensor([1.0000, 0.5000, 0.2500, 1.0000], grad_fn=<CatBackward0>)

Sharded (DistributedModelParallel), the position weights must be frozen: the sharded collections send per-id
weights as data and refuse weights that require grad (see fp_embedding_modules).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch
from torch import nn

from rectoolkit.sparse.jagged_tensor import JaggedTensor
from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor


def positions_in_bags(lengths: torch.Tensor) -> torch.Tensor:
    """Each id's index inside its bag: lengths [2, 0, 3] -> [0, 1, 0, 1, 2]."""
    lengths = lengths.long()
    starts = torch.cumsum(lengths, dim=0) - lengths
    return torch.arange(int(lengths.sum()), device=lengths.device) - torch.repeat_interleave(starts, lengths)


def position_weights_for(module: str, key: str, lengths: torch.Tensor, position_weight: torch.Tensor) -> torch.Tensor:
    """`position_weight[j]` for every id at position j of its bag; a bag longer than the table is refused."""
    max_length = position_weight.numel()
    longest = int(lengths.max()) if lengths.numel() else 0
    if longest > max_length:
        raise ValueError(f"{module}: feature {key!r} has a bag of {longest} ids but its max_feature_length is "
                         f"{max_length}; raise the max length or truncate the bags to {max_length} ids")
    return position_weight[positions_in_bags(lengths)]


def write_positions(module: str, features, max_length: Optional[int]) -> None:
    """`features.weights()[i] = ` the position of id i in its bag, in place (for `pre_process_input`); a bag longer
    than `max_length` is refused (None: no check here)."""
    weights = features.weights_or_none()
    if weights is None:
        raise ValueError(f"{module}.pre_process_input: the input has no weights to write the positions into; "
                         f"give it weights (e.g. torch.zeros(len(values)))")
    positions = positions_in_bags(features.lengths())
    longest = int(positions.max()) + 1 if positions.numel() else 0
    if max_length is not None and longest > max_length:
        raise ValueError(f"{module}.pre_process_input: a bag has {longest} ids but the max feature length is "
                         f"{max_length}; raise the max length or truncate the bags")
    weights.copy_(positions.to(weights.dtype))


class FeatureProcessor(nn.Module):
    """Base of per-feature processors: forward(JaggedTensor) -> JaggedTensor with weights."""

    def forward(self, features: JaggedTensor) -> JaggedTensor:
        raise NotImplementedError(f"{type(self).__name__} must define forward(features: JaggedTensor)")


class PositionWeightedModule(FeatureProcessor):
    """One feature's position weights, `position_weight` [max_feature_length], initialised to ones."""

    def __init__(self, max_feature_length: int, device: Optional[torch.device] = None) -> None:
        super().__init__()
        if max_feature_length <= 0:
            raise ValueError(f"PositionWeightedModule: max_feature_length={max_feature_length} must be positive")
        self.position_weight = nn.Parameter(torch.empty(max_feature_length, device=device))
        self._pre_processed = False
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.position_weight.fill_(1.0)

    def pre_process_input(self, features: JaggedTensor) -> None:
        """Write each id's position into `features`' weights (in place); forward then reads the positions from
        the weights instead of the lengths, as TorchRec's pipelined inputs do."""
        write_positions("PositionWeightedModule", features, self.position_weight.numel())
        self._pre_processed = True

    def forward(self, features: JaggedTensor) -> JaggedTensor:
        if self._pre_processed:
            weights = self.position_weight[features.weights().to(torch.int64)]
        else:
            weights = position_weights_for("PositionWeightedModule", "(this feature)", features.lengths(),
                                           self.position_weight)
        return JaggedTensor(values=features.values(), lengths=features.lengths(), weights=weights)


class FeatureProcessorsCollection(nn.Module):
    """Base of processors over a whole KJT: forward(KeyedJaggedTensor) -> KeyedJaggedTensor with weights."""

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        raise NotImplementedError(f"{type(self).__name__} must define forward(features: KeyedJaggedTensor)")


class PositionWeightedModuleCollection(FeatureProcessorsCollection):
    """Position weights for the features named in `max_feature_lengths` (`position_weights[key]`); the other
    features of the KJT get weight 1."""

    def __init__(self, max_feature_lengths: Dict[str, int], device: Optional[torch.device] = None) -> None:
        super().__init__()
        bad = {key: length for key, length in max_feature_lengths.items() if length <= 0}
        if bad:
            raise ValueError(f"PositionWeightedModuleCollection: max_feature_lengths {bad} must be positive")
        self.max_feature_lengths = dict(max_feature_lengths)
        self.position_weights = nn.ParameterDict()  # filled key by key: in the dict's order, as TorchRec's (a plain
        for key, length in max_feature_lengths.items():  # dict given to ParameterDict would be sorted)
            self.position_weights[key] = nn.Parameter(torch.empty(length, device=device))
        self._pre_processed = False
        self.reset_parameters()

    @property
    def position_weights_dict(self) -> Dict[str, nn.Parameter]:
        """The position weights as a plain dict (TorchRec's attribute); always the current parameters."""
        return dict(self.position_weights.items())

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for weight in self.position_weights.values():
                weight.fill_(1.0)

    def copy(self, device: torch.device) -> nn.Module:
        """This module with its position weights on `device` (TorchRec's CopyMixIn)."""
        return self.to(device)

    def pre_process_input(self, features: KeyedJaggedTensor) -> None:
        """Write each id's position into `features`' weights (in place); forward then reads the positions from
        the weights instead of the lengths, as TorchRec's pipelined inputs do."""
        write_positions("PositionWeightedModuleCollection", features, None)
        # only the features with position weights are bound by a max length (the others get weight 1)
        for key, lengths in zip(features.keys(), torch.split(features.lengths(), features.stride_per_key())):
            if key in self.max_feature_lengths:
                longest = int(lengths.max()) if lengths.numel() else 0
                if longest > self.max_feature_lengths[key]:
                    raise ValueError(f"PositionWeightedModuleCollection.pre_process_input: feature {key!r} has a "
                                     f"bag of {longest} ids but its max_feature_length is "
                                     f"{self.max_feature_lengths[key]}; raise the max length or truncate the bags")
        self._pre_processed = True

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return _position_weighted(features, self.position_weights_dict, self._pre_processed)


@torch.fx.wrap  # one call_function node under torch.fx.symbolic_trace, as TorchRec's get_weights_list
def _position_weighted(features: KeyedJaggedTensor, position_weights: Dict[str, torch.Tensor],
                       pre_processed: bool) -> KeyedJaggedTensor:
    """`features` with per-id weights: position_weights[key][position in bag], 1 for the keys without any."""
    lengths_per_key = torch.split(features.lengths(), features.stride_per_key())
    positions_per_key = (torch.split(features.weights().to(torch.int64), features.length_per_key())
                         if pre_processed else [None] * len(lengths_per_key))
    weights = []
    for key, lengths, positions in zip(features.keys(), lengths_per_key, positions_per_key):
        if key not in position_weights:
            weights.append(torch.ones(int(lengths.sum()), device=features.values().device))
        elif positions is not None:
            weights.append(position_weights[key][positions])
        else:
            weights.append(position_weights_for("PositionWeightedModuleCollection", key, lengths,
                                                position_weights[key]))
    return KeyedJaggedTensor(
        keys=features.keys(), values=features.values(), lengths=features.lengths(),
        weights=torch.cat(weights) if weights else features.weights_or_none(),
        stride=features.stride(),
        stride_per_key_per_rank=features.stride_per_key_per_rank() if features.variable_stride_per_key() else None,
        inverse_indices=features.inverse_indices_or_none())
