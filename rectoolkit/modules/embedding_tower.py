"""EmbeddingTower / EmbeddingTowerCollection (TorchRec's torchrec.modules.embedding_tower): an embedding module
whose output goes straight into its own interaction module, and towers side by side.

A tower keeps a group of features and their interaction together (TorchRec's sharders can then place a whole
tower on one host). Unsharded, a tower is just ``interaction(embedding(features))``; the collection
concatenates its towers' outputs along dim 1. Which KJT a tower reads follows TorchRec: an EmbeddingCollection
or an unweighted EmbeddingBagCollection reads ``features``, a weighted EmbeddingBagCollection reads
``weighted_features``, any other embedding module gets both.

    >>> import torch
    >>> from rectoolkit.modules.embedding_configs import EmbeddingBagConfig
    >>> from rectoolkit.modules.embedding_modules import EmbeddingBagCollection
    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig(name="t", num_embeddings=5, embedding_dim=2, feature_names=["f"])])
    >>> class Values(torch.nn.Module):
    ...     def forward(self, pooled):
    ...         return pooled.values()
    >>> towers = EmbeddingTowerCollection([EmbeddingTower(ebc, Values()), EmbeddingTower(ebc, Values())])
    >>> towers(KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))).shape
    torch.Size([2, 4])
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.sparse import KeyedJaggedTensor


def tower_input_params(module: nn.Module) -> Tuple[bool, bool]:
    """(reads the unweighted KJT, reads the weighted KJT) for a tower's embedding module, as TorchRec decides."""
    if isinstance(module, EmbeddingCollection):
        return True, False
    if isinstance(module, EmbeddingBagCollection):
        return not module.is_weighted(), module.is_weighted()
    return True, True


def _check_device(device: Optional[torch.device], modules: List[nn.Module], owner: str) -> None:
    """`device` says where the modules live: refuse a parameter elsewhere rather than ignore the argument. A
    parameter on the meta device is no conflict (TorchRec's models are built on meta for
    DistributedModelParallel, which gives them memory on the device)."""
    if device is None:
        return
    device = torch.device(device)
    for module in modules:
        for name, param in module.named_parameters():
            if param.device.type == "meta":
                continue
            if param.device.type != device.type or (device.index is not None and param.device != device):
                raise ValueError(f"{owner}(device={device}): parameter {name!r} of {type(module).__name__} is on "
                                 f"{param.device}; build the modules on {device} (or leave device=None)")


class EmbeddingTower(nn.Module):
    """An embedding module followed by its interaction: ``forward(*args) = interaction(embedding(*args))``.

    Args:
        embedding_module: e.g. an EmbeddingBagCollection.
        interaction_module: takes the embedding module's output, returns a [B, N] tensor.
        device: where both modules live (checked, not moved), or None.
    """

    def __init__(self, embedding_module: nn.Module, interaction_module: nn.Module,
                 device: Optional[torch.device] = None) -> None:
        super().__init__()
        _check_device(device, [embedding_module, interaction_module], "EmbeddingTower")
        self.embedding = embedding_module
        self.interaction = interaction_module

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.interaction(self.embedding(*args, **kwargs))


class EmbeddingTowerCollection(nn.Module):
    """Towers side by side: ``forward(features, weighted_features)`` -> [B, sum of the towers' N].

    Args:
        towers: the EmbeddingTowers.
        device: where the towers live (checked, not moved), or None.
    """

    def __init__(self, towers: List[EmbeddingTower], device: Optional[torch.device] = None) -> None:
        super().__init__()
        _check_device(device, list(towers), "EmbeddingTowerCollection")
        self.towers = nn.ModuleList(towers)
        self._input_params: List[Tuple[bool, bool]] = [tower_input_params(tower.embedding) for tower in towers]

    def forward(self, features: Optional[KeyedJaggedTensor] = None,
                weighted_features: Optional[KeyedJaggedTensor] = None) -> torch.Tensor:
        outputs = []
        for index, (tower, (reads_kjt, reads_weighted)) in enumerate(zip(self.towers, self._input_params)):
            needed = {"features": reads_kjt and features is None,
                      "weighted_features": reads_weighted and weighted_features is None}
            missing = [name for name, is_missing in needed.items() if is_missing]
            if missing:
                raise ValueError(f"EmbeddingTowerCollection: tower {index} ({type(tower.embedding).__name__}) reads "
                                 f"{' and '.join(missing)}, which {'was' if len(missing) == 1 else 'were'} not given; "
                                 "pass them to forward")
            if reads_kjt and reads_weighted:
                outputs.append(tower(features, weighted_features))
            elif reads_weighted:
                outputs.append(tower(weighted_features))
            else:
                outputs.append(tower(features))
        return torch.cat(outputs, dim=1)
