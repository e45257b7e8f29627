"""DLRM and DLRM_DCN at TorchRec's path (`torchrec.models.dlrm`).

`DLRM` is the demo model of `rectoolkit.train.model`; `DLRM_DCN` swaps its pairwise-dot interaction for a
low-rank cross network over the concatenated [dense, feature_1, ..., feature_F] vectors (DCN-v2):

    dense [B, dense_in] --dense MLP--> [B, D] --+
                                                +--> concat [B, (F + 1) * D] --LowRankCrossNet--> over MLP --> [B, 1]
    sparse KJT --EmbeddingBagCollection--> [B, F, D]

    >>> import torch, rectoolkit as rtk
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4,
    ...                                                           feature_names=["f0", "f1"])])
    >>> model = DLRM_DCN(ebc, dense_in_features=3, dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1],
    ...                  dcn_num_layers=2, dcn_low_rank_dim=2)
    >>> kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 0, 1]))
    >>> model(torch.randn(2, 3), kjt).shape
    torch.Size([2, 1])

Constructor, submodule names and state_dict keys are TorchRec's, so a state_dict loads either way.
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from rectoolkit.modules.crossnet import LowRankCrossNet
from rectoolkit.train.model import DLRM, DenseArch, InteractionArch, OverArch, SparseArch


class InteractionDCNArch(nn.Module):
    """`crossnet` over the dense vector and the F pooled embeddings, flattened: -> [B, (F + 1) * D]."""

    def __init__(self, num_sparse_features: int, crossnet: nn.Module) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.crossnet = crossnet

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        vectors = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1)  # [B, F + 1, D]
        return self.crossnet(vectors.flatten(1))


class DLRM_DCN(DLRM):
    """DLRM whose interaction is a `LowRankCrossNet` of `dcn_num_layers` layers of rank `dcn_low_rank_dim`."""

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: List[int], over_arch_layer_sizes: List[int],
                 dcn_num_layers: int, dcn_low_rank_dim: int) -> None:
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes)
        num_features = len(self.sparse_arch.feature_names)
        crossed_features = (num_features + 1) * self.sparse_arch.embedding_dim
        self.inter_arch = InteractionDCNArch(num_features, LowRankCrossNet(
            in_features=crossed_features, num_layers=dcn_num_layers, low_rank=dcn_low_rank_dim))
        self.over_arch = OverArch(crossed_features, over_arch_layer_sizes)


__all__ = ["DLRM", "DLRM_DCN", "DenseArch", "InteractionArch", "InteractionDCNArch", "OverArch", "SparseArch"]
