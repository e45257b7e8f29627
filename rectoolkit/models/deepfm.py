"""SimpleDeepFMNN and SimpleDeepFMNNWrapper at TorchRec's path (`torchrec.models.deepfm`): DeepFM (Guo et al., 2017) on a KJT.

    dense [B, dense_in] --MLP--> [B, D] ---------------------------+--> [dense, DeepFM(all), FM(all)]
    sparse KJT --EmbeddingBagCollection--> KeyedTensor [B, F * D] -+        --> Linear + Sigmoid --> [B, 1]

    >>> import torch, rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4,
    ...                                                           feature_names=["f0", "f1"])])
    >>> model = SimpleDeepFMNN(num_dense_features=3, embedding_bag_collection=ebc, hidden_layer_size=8,
    ...                        deep_fm_dimension=5)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 0, 1]))
    >>> model(torch.randn(2, 3), kjt).shape
    torch.Size([2, 1])

Constructor, submodule names, state_dict keys and math are TorchRec's (its output is a probability: the over
arch ends in a sigmoid).
"""

from __future__ import annotations

from typing import List, Tuple, Union

import torch
from torch import nn

from rectoolkit.models.model_input import dense_and_sparse, loss_and_prediction
from rectoolkit.modules.deepfm import DeepFM, FactorizationMachine


class SparseArch(nn.Module):
    """The embedding collection: KJT -> KeyedTensor of pooled embeddings."""

    def __init__(self, embedding_bag_collection: nn.Module) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection

    def forward(self, features):
        return self.embedding_bag_collection(features)


class DenseArch(nn.Module):
    """Two ReLU layers: [B, in_features] -> [B, hidden_layer_size] -> [B, embedding_dim]."""

    def __init__(self, in_features: int, hidden_layer_size: int, embedding_dim: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(in_features, hidden_layer_size), nn.ReLU(),
                                   nn.Linear(hidden_layer_size, embedding_dim), nn.ReLU())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class FMInteractionArch(nn.Module):
    """[dense, DeepFM, FM] over the dense vector and every sparse feature's pooled embedding:
    -> [B, D + deep_fm_dimension + 1]."""

    def __init__(self, fm_in_features: int, sparse_feature_names: List[str], deep_fm_dimension: int) -> None:
        super().__init__()
        self.sparse_feature_names = list(sparse_feature_names)
        self.deep_fm = DeepFM(dense_module=nn.Sequential(nn.Linear(fm_in_features, deep_fm_dimension), nn.ReLU()))
        self.fm = FactorizationMachine()

    def forward(self, dense_features: torch.Tensor, sparse_features) -> torch.Tensor:
        if not self.sparse_feature_names:
            return dense_features
        tensors = [dense_features] + [sparse_features[name] for name in self.sparse_feature_names]
        return torch.cat([dense_features, self.deep_fm(tensors), self.fm(tensors)], dim=1)


class OverArch(nn.Module):
    """Linear to one output, then a sigmoid: -> [B, 1] probabilities."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Linear(in_features, 1), nn.Sigmoid())

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class SimpleDeepFMNN(nn.Module):
    """DeepFM over dense features and a KJT: forward(dense_features [B, num_dense_features], KJT) -> [B, 1]."""

    def __init__(self, num_dense_features: int, embedding_bag_collection: nn.Module, hidden_layer_size: int,
                 deep_fm_dimension: int) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        if not configs:
            raise ValueError("SimpleDeepFMNN: the embedding_bag_collection has no tables; give it at least one")
        dims = {config.name: config.embedding_dim for config in configs}
        if len(set(dims.values())) != 1:
            raise ValueError(f"SimpleDeepFMNN needs every table to have the same embedding_dim, got {dims}; "
                             f"give all tables one dim")
        embedding_dim = configs[0].embedding_dim
        feature_names = [name for config in configs for name in config.feature_names]
        self.sparse_arch = SparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(num_dense_features, hidden_layer_size, embedding_dim)
        self.inter_arch = FMInteractionArch(fm_in_features=embedding_dim * (len(feature_names) + 1),
                                            sparse_feature_names=feature_names, deep_fm_dimension=deep_fm_dimension)
        self.over_arch = OverArch(embedding_dim + deep_fm_dimension + 1)

    def forward(self, dense_features: torch.Tensor, sparse_features) -> torch.Tensor:
        dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense_features=dense, sparse_features=sparse))


class SimpleDeepFMNNWrapper(SimpleDeepFMNN):
    """A SimpleDeepFMNN whose forward takes one batch object (TorchRec's ``ModelInput``): in training it returns
    (loss, prediction), in eval the prediction. As TorchRec's, the loss is BCE-with-logits of the prediction, which
    is already a sigmoid's output (so the numbers equal TorchRec's)."""

    def forward(self, model_input) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:  # type: ignore[override]
        dense, sparse = dense_and_sparse(model_input, "SimpleDeepFMNNWrapper")
        return loss_and_prediction(self, super().forward(dense, sparse), model_input)
