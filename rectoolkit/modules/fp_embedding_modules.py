"""`FeatureProcessedEmbeddingBagCollection` (TorchRec's `torchrec.modules.fp_embedding_modules`): feature
processors turn each feature's ids into (ids, weights), then a weighted EmbeddingBagCollection pools them.

    KJT --feature processors--> KJT with per-id weights --EmbeddingBagCollection(is_weighted=True)--> KeyedTensor

    >>> import torch, rectoolkit as rtk
    >>> from rectoolkit.modules.feature_processor_ import PositionWeightedModuleCollection
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=2,
    ...                                                          feature_names=["hist"])], is_weighted=True)
    >>> fp_ebc = FeatureProcessedEmbeddingBagCollection(ebc, PositionWeightedModuleCollection({"hist": 3}))
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["hist"], torch.tensor([1, 2, 3]), torch.tensor([2, 1]))
    >>> fp_ebc(kjt).values().shape
    torch.Size([2, 2])

`feature_processors` is either one `FeatureProcessorsCollection` over the whole KJT, or a dict with one
`FeatureProcessor` per feature of the collection (every feature, no other). Under DistributedModelParallel the
collection inside is sharded (a plan keyed by this module's path, as TorchRec keys it, is accepted) and the
processors stay dense; their weights must be frozen there (the sharded input_dist sends per-id weights as data).
"""

from __future__ import annotations

from typing import Dict, List, Tuple, Union

import torch
from torch import nn

from rectoolkit.modules.feature_processor_ import FeatureProcessor, FeatureProcessorsCollection
from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor


class FeatureProcessorDictWrapper(FeatureProcessorsCollection):
    """A dict of per-feature processors used as one collection (what `split()` returns for the dict form)."""

    def __init__(self, feature_processors: nn.ModuleDict) -> None:
        super().__init__()
        self._feature_processors = feature_processors

    def forward(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        return apply_feature_processors(features, self._feature_processors)


def apply_feature_processors(features: KeyedJaggedTensor, processors: nn.ModuleDict) -> KeyedJaggedTensor:
    """Each key's JaggedTensor through its processor; the keys without one get weight 1."""
    weights = []
    for key, jagged in features.to_dict().items():
        if key in processors:
            weights.append(processors[key](jagged).weights())
        else:
            weights.append(torch.ones(jagged.values().numel(), device=jagged.values().device))
    return KeyedJaggedTensor(
        keys=features.keys(), values=features.values(), lengths=features.lengths(),
        weights=torch.cat(weights) if weights else features.weights_or_none(), stride=features.stride(),
        stride_per_key_per_rank=features.stride_per_key_per_rank() if features.variable_stride_per_key() else None,
        inverse_indices=features.inverse_indices_or_none())


class FeatureProcessedEmbeddingBagCollection(nn.Module):
    """A weighted EmbeddingBagCollection whose per-id weights come from feature processors."""

    def __init__(self, embedding_bag_collection: nn.Module,
                 feature_processors: Union[Dict[str, FeatureProcessor], FeatureProcessorsCollection]) -> None:
        super().__init__()
        if not embedding_bag_collection.is_weighted():
            raise ValueError("FeatureProcessedEmbeddingBagCollection: the embedding_bag_collection is not weighted; "
                             "build it with is_weighted=True so it pools the processors' weights")
        self._embedding_bag_collection = embedding_bag_collection
        feature_names = [name for config in embedding_bag_collection.embedding_bag_configs()
                         for name in config.feature_names]
        if isinstance(feature_processors, FeatureProcessorsCollection):
            self._feature_processors = feature_processors
        else:
            missing = [name for name in feature_names if name not in feature_processors]
            extra = [name for name in feature_processors if name not in feature_names]
            if missing or extra:
                raise ValueError(f"FeatureProcessedEmbeddingBagCollection: the feature processors' keys must be the "
                                 f"collection's features {feature_names}; missing {missing}, not a feature {extra}")
            self._feature_processors = nn.ModuleDict(feature_processors)
        self._feature_names = feature_names

    def is_weighted(self) -> bool:
        return self._embedding_bag_collection.is_weighted()

    def split(self) -> Tuple[FeatureProcessorsCollection, nn.Module]:
        """(the processors as one collection, the embedding bag collection), as TorchRec's sharder takes them."""
        if isinstance(self._feature_processors, nn.ModuleDict):
            return FeatureProcessorDictWrapper(self._feature_processors), self._embedding_bag_collection
        return self._feature_processors, self._embedding_bag_collection

    def forward(self, features: KeyedJaggedTensor):
        if isinstance(self._feature_processors, FeatureProcessorsCollection):
            return self._embedding_bag_collection(self._feature_processors(features))
        # every key keeps its place, batch size and inverse indices; the collection reads only its own features
        processed = apply_feature_processors_checked(features, self._feature_processors, self._feature_names)
        return self._embedding_bag_collection(processed)


@torch.fx.wrap  # one node under torch.fx.symbolic_trace: the keys of a traced KJT cannot be read while tracing
def apply_feature_processors_checked(features: KeyedJaggedTensor, processors: nn.ModuleDict,
                                     feature_names: List[str]) -> KeyedJaggedTensor:
    """apply_feature_processors, after checking that every feature of the collection is a key of the KJT."""
    missing = [name for name in feature_names if name not in features.keys()]
    if missing:
        raise ValueError(f"FeatureProcessedEmbeddingBagCollection: the KJT has keys {features.keys()} but not "
                         f"{missing}; every feature of the collection needs a key")
    return apply_feature_processors(features, processors)
