"""DLRM, DLRM_DCN and DLRM_Projection at TorchRec's path (`torchrec.models.dlrm`).

`DLRM` is the demo model of `rectoolkit.train.model`; `DLRM_DCN` swaps its pairwise-dot interaction for a
low-rank cross network over the concatenated [dense, feature_1, ..., feature_F] vectors (DCN-v2);
`DLRM_Projection` for the products of two learned projections of them (Y [B, F1, D] times Z [B, D, F2]):

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

import math

from typing import List, Optional, Tuple, Union

import torch
from torch import nn

from rectoolkit.models.model_input import dense_and_sparse, loss_and_prediction
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


class InteractionProjectionArch(nn.Module):
    """[dense, Y Z flattened]: Y = branch1(x) seen as [B, F1, D], Z = branch2(x) seen as [B, D, F2], where x is the
    dense vector and the F pooled embeddings flattened; -> [B, D + F1 * F2]."""

    def __init__(self, num_sparse_features: int, interaction_branch1: nn.Module,
                 interaction_branch2: nn.Module) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.interaction_branch1 = interaction_branch1
        self.interaction_branch2 = interaction_branch2

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        batch_size, dim = dense_features.shape
        vectors = torch.cat([dense_features.unsqueeze(1), sparse_features], dim=1).reshape(batch_size, -1)
        projected_1 = self.interaction_branch1(vectors).reshape(batch_size, -1, dim)  # [B, F1, D]
        projected_2 = self.interaction_branch2(vectors).reshape(batch_size, dim, -1)  # [B, D, F2]
        return torch.cat([dense_features, torch.bmm(projected_1, projected_2).reshape(batch_size, -1)], dim=1)


class DLRM_DCN(DLRM):
    """DLRM whose interaction is a `LowRankCrossNet` of `dcn_num_layers` layers of rank `dcn_low_rank_dim`."""

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: List[int], over_arch_layer_sizes: List[int],
                 dcn_num_layers: int, dcn_low_rank_dim: int, dense_device: Optional[torch.device] = None) -> None:
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes,
                         dense_device)
        num_features = len(self.sparse_arch.feature_names)
        crossed_features = (num_features + 1) * self.sparse_arch.embedding_dim
        self.inter_arch = InteractionDCNArch(num_features, LowRankCrossNet(
            in_features=crossed_features, num_layers=dcn_num_layers, low_rank=dcn_low_rank_dim))
        self.over_arch = OverArch(crossed_features, over_arch_layer_sizes, device=dense_device)


class DLRM_Projection(DLRM):
    """DLRM whose interaction is `InteractionProjectionArch`: two ReLU MLPs project [dense, features] to F1 * D
    and F2 * D values (the last sizes of `interaction_branch{1,2}_layer_sizes`, multiples of D)."""

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: List[int], over_arch_layer_sizes: List[int],
                 interaction_branch1_layer_sizes: List[int], interaction_branch2_layer_sizes: List[int],
                 dense_device: Optional[torch.device] = None) -> None:
        super().__init__(embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes,
                         dense_device)
        dim = self.sparse_arch.embedding_dim
        num_features = len(self.sparse_arch.feature_names)
        projected = []
        for branch, sizes in (("interaction_branch1_layer_sizes", interaction_branch1_layer_sizes),
                              ("interaction_branch2_layer_sizes", interaction_branch2_layer_sizes)):
            if not sizes or sizes[-1] % dim:
                raise ValueError(f"DLRM_Projection: {branch}={list(sizes)} must end in a multiple of the tables' "
                                 f"embedding_dim={dim}, e.g. {[*sizes[:-1], 2 * dim]}")
            projected.append(sizes[-1] // dim)
        branch_in = num_features * dim + dense_arch_layer_sizes[-1]
        self.inter_arch = InteractionProjectionArch(
            num_features, DenseArch(branch_in, interaction_branch1_layer_sizes, device=dense_device),
            DenseArch(branch_in, interaction_branch2_layer_sizes, device=dense_device))
        self.over_arch = OverArch(dim + projected[0] * projected[1], over_arch_layer_sizes, device=dense_device)


class DLRMTrain(nn.Module):
    """A DLRM (or DLRM_DCN, DLRM_Projection) with its loss, for train pipelines: forward(batch) ->
    (loss, (loss, logits, labels)), all detached but the first; `batch` has TorchRec's `Batch` fields."""

    def __init__(self, dlrm_module: DLRM) -> None:
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss()

    def forward(self, batch) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


class DLRMWrapper(DLRM):
    """A DLRM whose forward takes one batch object (TorchRec's ``ModelInput``: ``float_features``,
    ``idlist_features``, ``label``): in training it returns (BCE-with-logits loss, logits), in eval the logits.

    >>> import torch, rectoolkit as rtk
    >>> from types import SimpleNamespace
    >>> ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t0", num_embeddings=10, embedding_dim=4,
    ...                                                           feature_names=["f0"])])
    >>> model = DLRMWrapper(ebc, dense_in_features=3, dense_arch_layer_sizes=[4], over_arch_layer_sizes=[3, 1])
    >>> batch = SimpleNamespace(float_features=torch.randn(2, 3), label=torch.tensor([0.0, 1.0]),
    ...     idlist_features=rtk.KeyedJaggedTensor.from_lengths_sync(["f0"], torch.tensor([1, 2]), torch.tensor([1, 1])))
    >>> loss, logits = model(batch)
    >>> loss.shape, logits.shape
    (torch.Size([]), torch.Size([2, 1]))
    """

    def forward(self, model_input) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:  # type: ignore[override]
        dense, sparse = dense_and_sparse(model_input, "DLRMWrapper")
        return loss_and_prediction(self, super().forward(dense_features=dense, sparse_features=sparse), model_input)


def choose(n: int, k: int) -> int:
    """n choose k, 0 outside 0 <= k <= n (TorchRec's helper).

        >>> choose(4, 2), choose(2, 3)
        (6, 0)
    """
    return math.comb(n, k) if 0 <= k <= n else 0


__all__ = ["DLRM", "DLRM_DCN", "DLRMTrain", "DLRMWrapper", "DLRM_Projection", "DenseArch", "InteractionArch", "InteractionDCNArch",
           "InteractionProjectionArch", "OverArch", "SparseArch", "choose"]
