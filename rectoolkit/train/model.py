"""DLRM for demos, read top to bottom like the paper (Naumov et al., 2019), with TorchRec's names.

    dense features [B, 13] --dense MLP--> [B, D] ------------------------+
                                                                          +--> pairwise dots --> over MLP --> logit [B, 1]
    sparse KJT --EmbeddingBagCollection--> KeyedTensor [B, F * D] --------+

    >>> import rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4,
    ...                                                           feature_names=["f0", "f1"])])
    >>> model = DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1])
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 0, 1]))
    >>> model(torch.randn(2, 3), kjt).shape
    torch.Size([2, 1])

Same constructor, submodule names, state_dict keys and math as `torchrec.models.dlrm.DLRM`, so a state_dict
loads either way (tests/train/test_dlrm_model.py checks the outputs agree).
"""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from rectoolkit.modules.mlp import MLP


class SparseArch(nn.Module):
    """The embedding collection: KJT -> [B, F, D] (one pooled D-vector per feature)."""

    def __init__(self, embedding_bag_collection: nn.Module) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        dims = {c.embedding_dim for c in configs}
        if len(dims) != 1:
            raise ValueError(f"DLRM needs every table to have the same embedding_dim, got "
                             f"{ {c.name: c.embedding_dim for c in configs} }; give all tables one dim")
        self.embedding_dim = dims.pop()
        self.feature_names = [f for c in configs for f in c.feature_names]
        self.D = self.embedding_dim  # TorchRec's attribute names
        self.F = len(self.feature_names)

    @property
    def sparse_feature_names(self) -> List[str]:
        """The features in the order their pooled vectors come out (TorchRec's name)."""
        return self.feature_names

    def forward(self, features) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features)  # KeyedTensor [B, F * D]
        # TorchRec's way (by name) under torch.fx, or for a collection that orders its output otherwise
        if isinstance(pooled, torch.fx.Proxy) or pooled.keys() != self.feature_names:
            by_name = pooled.to_dict()
            return torch.cat([by_name[name] for name in self.feature_names], dim=1).reshape(-1, self.F, self.D)
        return pooled.values().reshape(-1, self.F, self.D)


class DenseArch(nn.Module):
    """MLP over the dense features: [B, dense_in] -> [B, D] (ReLU after every layer)."""

    def __init__(self, in_features: int, layer_sizes: List[int], device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.model = MLP(in_features, layer_sizes, activation="relu", device=device)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class InteractionArch(nn.Module):
    """Dot products of every pair among [dense, feature_1, ..., feature_F], appended to the dense vector.

    Output: [B, D + (F + 1) * F / 2].
    """

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.register_buffer("triu_indices", torch.triu_indices(self.F + 1, self.F + 1, offset=1), persistent=False)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1)  # [B, F + 1, D]
        dots = torch.bmm(vectors, vectors.transpose(1, 2))  # [B, F + 1, F + 1]
        pairs = dots[:, self.triu_indices[0], self.triu_indices[1]]
        return torch.cat([dense_features, pairs], dim=1)


class OverArch(nn.Module):
    """MLP over the interactions; the last layer is a plain Linear (it gives the logit).

    TorchRec's layout, so state_dict keys match: `model.0` is the ReLU MLP, `model.1` the last Linear.
    """

    def __init__(self, in_features: int, layer_sizes: List[int], device: Optional[torch.device] = None) -> None:
        super().__init__()
        if len(layer_sizes) < 2:
            raise ValueError(f"OverArch: over_arch_layer_sizes={list(layer_sizes)} needs at least two sizes "
                             f"(hidden layers, then the output), e.g. [{in_features}, 1]")
        self.model = nn.Sequential(MLP(in_features, layer_sizes[:-1], activation="relu", device=device),
                                   nn.Linear(layer_sizes[-2], layer_sizes[-1], device=device))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class DLRM(nn.Module):
    """Deep Learning Recommendation Model: forward(dense_features [B, dense_in], sparse KJT) -> logits [B, 1].

    `dense_arch_layer_sizes[-1]` must equal the tables' embedding_dim (dense and sparse vectors are dotted).
    `dense_device` is where the dense, interaction and over arches are built (the tables stay where they are).
    """

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: List[int], over_arch_layer_sizes: List[int],
                 dense_device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        if dense_arch_layer_sizes[-1] != self.sparse_arch.embedding_dim:
            raise ValueError(f"dense_arch_layer_sizes[-1]={dense_arch_layer_sizes[-1]} must equal the tables' "
                             f"embedding_dim={self.sparse_arch.embedding_dim} (DLRM dots dense and sparse vectors)")
        num_features = len(self.sparse_arch.feature_names)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, device=dense_device)
        self.inter_arch = InteractionArch(num_features)
        over_in = dense_arch_layer_sizes[-1] + num_features * (num_features + 1) // 2
        self.over_arch = OverArch(over_in, over_arch_layer_sizes, device=dense_device)
        self._cuda_graph_enabled = False

    def compile_dense_path(self, compile_mode: str = "reduce-overhead") -> None:
        """`torch.compile` the dense, interaction and over arches (TorchRec's CUDA-graph switch; the sparse arch
        stays eager, its shapes change every batch). Calling it again does nothing."""
        if self._cuda_graph_enabled:
            return
        self.dense_arch = torch.compile(self.dense_arch, mode=compile_mode)
        self.inter_arch = torch.compile(self.inter_arch, mode=compile_mode)
        self.over_arch = torch.compile(self.over_arch, mode=compile_mode)
        self._cuda_graph_enabled = True

    def forward(self, dense_features: torch.Tensor, sparse_features) -> torch.Tensor:
        dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(dense_features=dense, sparse_features=sparse))
