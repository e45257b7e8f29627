"""Embedding collections behind managed collisions (TorchRec's `torchrec.modules.mc_embedding_modules`).

    KJT of raw ids --ManagedCollisionCollection--> KJT of rows --EmbeddingBagCollection / EmbeddingCollection-->
    (embeddings, remapped KJT if return_remapped_features else None)

As in TorchRec, an unsharded collection keeps an evicted row's weights: the id that wins the row starts from
them (the rows evicted are reported by `_managed_collision_collection.evict()`).

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.modules.mc_modules import LFU_EvictionPolicy, MCHManagedCollisionModule
    >>> from rectoolkit.modules.mc_modules import ManagedCollisionCollection
    >>> tables = [rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2, feature_names=["user"])]
    >>> mc_ebc = ManagedCollisionEmbeddingBagCollection(
    ...     rtk.EmbeddingBagCollection(tables),
    ...     ManagedCollisionCollection({"t": MCHManagedCollisionModule(4, "cpu", LFU_EvictionPolicy(), 1)}, tables),
    ...     return_remapped_features=True)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["user"], torch.tensor([10**15, 3]), torch.tensor([1, 1]))
    >>> pooled, remapped = mc_ebc(kjt)
    >>> pooled.values().shape, remapped.values().tolist()
    (torch.Size([2, 2]), [2, 1])
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import nn

from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.modules.mc_modules import ManagedCollisionCollection
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor


class BaseManagedCollisionEmbeddingCollection(nn.Module):
    """A managed-collision collection in front of an embedding collection with the same table configs."""

    def __init__(self, embedding_module: Union[EmbeddingBagCollection, EmbeddingCollection],
                 managed_collision_collection: ManagedCollisionCollection, return_remapped_features: bool = False,
                 allow_in_place_embed_weight_update: bool = False) -> None:
        super().__init__()
        owner = type(self).__name__
        if allow_in_place_embed_weight_update:
            raise NotImplementedError(
                f"{owner}: allow_in_place_embed_weight_update=True is how TorchRec's sharded collection "
                "re-initializes evicted rows; rectoolkit keeps their weights, sharded or not (as TorchRec's unsharded "
                "collection does), so the flag would change nothing: leave it False")
        self._managed_collision_collection = managed_collision_collection  # first: TorchRec's state_dict order
        self._return_remapped_features = return_remapped_features
        self._allow_in_place_embed_weight_update = allow_in_place_embed_weight_update
        self._embedding_module = embedding_module
        configs = (embedding_module.embedding_bag_configs() if isinstance(embedding_module, EmbeddingBagCollection)
                   else embedding_module.embedding_configs())
        mc_configs = list(managed_collision_collection.embedding_configs())
        if list(configs) != mc_configs:
            raise ValueError(f"{owner}: the embedding collection's tables {[c.name for c in configs]} and the "
                             f"managed collision collection's {[c.name for c in mc_configs]} must be the same "
                             "configs (same names, sizes and features, in the same order); build both from one list")

    def forward(self, features: KeyedJaggedTensor, mutate_miss_lengths: bool = True
                ) -> Tuple[Union[KeyedTensor, Dict[str, JaggedTensor]], Optional[KeyedJaggedTensor]]:
        """Remaps the ids, looks up their rows; returns (embeddings, remapped features or None)."""
        features = self._managed_collision_collection(features, mutate_miss_lengths=mutate_miss_lengths)
        embeddings = self._embedding_module(features)
        return embeddings, (features if self._return_remapped_features else None)

    def lookup_remapped_lengths_mask(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Remaps the ids (training: recording them) and returns which bags are non-empty."""
        return self._managed_collision_collection(features, mutate_miss_lengths=True).lengths().to(torch.bool)


class ManagedCollisionEmbeddingCollection(BaseManagedCollisionEmbeddingCollection):
    """An EmbeddingCollection behind managed collisions: returns (dict of JaggedTensors, remapped KJT or None).

    Arguments: (embedding_collection, managed_collision_collection, return_remapped_features=False,
    allow_in_place_embed_weight_update=False), TorchRec's names.
    """

    def __init__(self, embedding_collection: EmbeddingCollection, *args: Any, **kwargs: Any) -> None:
        super().__init__(embedding_collection, *args, **kwargs)


class ManagedCollisionEmbeddingBagCollection(BaseManagedCollisionEmbeddingCollection):
    """An EmbeddingBagCollection behind managed collisions: returns (KeyedTensor, remapped KJT or None).

    Arguments: (embedding_bag_collection, managed_collision_collection, return_remapped_features=False,
    allow_in_place_embed_weight_update=False), TorchRec's names.
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection, *args: Any, **kwargs: Any) -> None:
        super().__init__(embedding_bag_collection, *args, **kwargs)
