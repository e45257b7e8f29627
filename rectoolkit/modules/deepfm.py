"""DeepFM's two interaction blocks (Guo et al., 2017) with TorchRec's constructors
(`torchrec.modules.deepfm`). Both take a list of tensors [B, ...], flatten each to [B, n_i] and concatenate
them into x [B, N] (N = sum of n_i):

    DeepFM                dense_module(x)                                          -> [B, out]
    FactorizationMachine  0.5 * ((sum_i x_i)^2 - sum_i x_i^2), summed over x's N entries -> [B, 1]

    >>> import torch
    >>> embeddings = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0]])]
    >>> FactorizationMachine()(embeddings)  # 1*2 + 1*3 + 2*3
    tensor([[11.]])
"""

from __future__ import annotations

from typing import List

import torch
from torch import nn


def _flatten_and_concat(module: str, embeddings: List[torch.Tensor]) -> torch.Tensor:
    if not torch.jit.is_scripting():  # (torch.jit.script compiles TorchRec's computation: the checks are left out)
        _check_embeddings(module, embeddings)
    return torch.cat([tensor.flatten(1) for tensor in embeddings], dim=1)


@torch.jit.unused
def _check_embeddings(module: str, embeddings: List[torch.Tensor]) -> None:
    """At least one tensor, all [batch_size, ...] with one batch_size (no shapes to check while torch.fx traces)."""
    if not embeddings:
        raise ValueError(f"{module}: got an empty list of embeddings; pass at least one [batch_size, ...] tensor")
    if any(isinstance(tensor, torch.fx.Proxy) for tensor in embeddings):
        return
    batch_sizes = [tensor.shape[0] if tensor.dim() else None for tensor in embeddings]
    if len(set(batch_sizes)) != 1 or batch_sizes[0] is None:
        raise ValueError(f"{module}: the embeddings' first dimensions {batch_sizes} differ; every tensor must be "
                         f"[batch_size, ...] with one batch_size")


class DeepFM(nn.Module):
    """The deep part of DeepFM: `dense_module` over the flattened, concatenated embeddings.

        >>> deep = DeepFM(dense_module=torch.nn.Linear(3, 2))
        >>> deep([torch.randn(4, 1, 2), torch.randn(4, 1)]).shape
        torch.Size([4, 2])
    """

    def __init__(self, dense_module: nn.Module) -> None:
        super().__init__()
        self.dense_module = dense_module

    def forward(self, embeddings: List[torch.Tensor]) -> torch.Tensor:
        return self.dense_module(_flatten_and_concat("DeepFM", embeddings))


class FactorizationMachine(nn.Module):
    """The second-order part of an FM over every entry of the flattened embeddings; no parameters."""

    def forward(self, embeddings: List[torch.Tensor]) -> torch.Tensor:
        x = _flatten_and_concat("FactorizationMachine", embeddings)
        square_of_sum = x.sum(dim=1, keepdim=True) ** 2
        sum_of_squares = (x * x).sum(dim=1, keepdim=True)
        return 0.5 * (square_of_sum - sum_of_squares)
