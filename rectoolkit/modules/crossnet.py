"""Cross networks of DCN (Wang et al., 2017 and 2020) with TorchRec's constructors and parameter names
(`torchrec.modules.crossnet`). Each layer crosses the input x_0 with the running x_l and adds x_l back:

    CrossNet          x_{l+1} = x_0 * (W_l x_l + b_l) + x_l          W_l: [N, N]
    LowRankCrossNet   x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l    U_l: [N, r], V_l: [r, N]
    VectorCrossNet    x_{l+1} = x_0 (x_l . w_l) + b_l + x_l          w_l: [N]

    >>> import torch
    >>> CrossNet(in_features=6, num_layers=2)(torch.randn(3, 6)).shape
    torch.Size([3, 6])
    >>> sorted(LowRankCrossNet(6, num_layers=1, low_rank=2).state_dict())
    ['V_kernels.0', 'W_kernels.0', 'bias.0']
"""

from __future__ import annotations

import torch
from torch import nn


def _xavier(*shape: int) -> nn.Parameter:
    return nn.Parameter(nn.init.xavier_normal_(torch.empty(*shape)))


def _zeros(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape))


def _check_input(module: str, input: torch.Tensor, in_features: int) -> None:
    if input.dim() != 2 or input.shape[1] != in_features:
        raise ValueError(f"{module}: input has shape {list(input.shape)} but in_features={in_features}; "
                         f"pass a [batch_size, {in_features}] tensor")


def _check_sizes(module: str, in_features: int, num_layers: int) -> None:
    if in_features <= 0 or num_layers < 0:
        raise ValueError(f"{module}: in_features={in_features} must be positive and num_layers={num_layers} "
                         f"at least 0")


class CrossNet(nn.Module):
    """Full-rank cross network: [B, in_features] -> [B, in_features]."""

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check_sizes("CrossNet", in_features, num_layers)
        self._in_features = in_features
        self._num_layers = num_layers
        self.kernels = nn.ParameterList([_xavier(in_features, in_features) for _ in range(num_layers)])
        self.bias = nn.ParameterList([_zeros(in_features, 1) for _ in range(num_layers)])

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_input("CrossNet", input, self._in_features)
        x_0 = input
        x_l = x_0
        for kernel, bias in zip(self.kernels, self.bias):
            x_l = x_0 * (x_l @ kernel.T + bias.squeeze(1)) + x_l
        return x_l


class LowRankCrossNet(nn.Module):
    """Cross network whose [N, N] kernels are factored into W [N, low_rank] times V [low_rank, N]."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int = 1) -> None:
        super().__init__()
        _check_sizes("LowRankCrossNet", in_features, num_layers)
        if low_rank < 1:
            raise ValueError(f"LowRankCrossNet: low_rank={low_rank} must be at least 1")
        self._in_features = in_features
        self._num_layers = num_layers
        self._low_rank = low_rank
        self.W_kernels = nn.ParameterList([_xavier(in_features, low_rank) for _ in range(num_layers)])
        self.V_kernels = nn.ParameterList([_xavier(low_rank, in_features) for _ in range(num_layers)])
        self.bias = nn.ParameterList([_zeros(in_features) for _ in range(num_layers)])

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_input("LowRankCrossNet", input, self._in_features)
        x_0 = input
        x_l = x_0
        for w_kernel, v_kernel, bias in zip(self.W_kernels, self.V_kernels, self.bias):
            x_l = x_0 * (x_l @ v_kernel.T @ w_kernel.T + bias) + x_l
        return x_l


class VectorCrossNet(nn.Module):
    """Cross network with one weight vector per layer: x_0 scaled by the scalar x_l . w_l."""

    def __init__(self, in_features: int, num_layers: int) -> None:
        super().__init__()
        _check_sizes("VectorCrossNet", in_features, num_layers)
        self._in_features = in_features
        self._num_layers = num_layers
        self.kernels = nn.ParameterList([_xavier(in_features, 1) for _ in range(num_layers)])
        self.bias = nn.ParameterList([_zeros(in_features, 1) for _ in range(num_layers)])

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_input("VectorCrossNet", input, self._in_features)
        x_0 = input
        x_l = x_0
        for kernel, bias in zip(self.kernels, self.bias):
            x_l = x_0 * (x_l @ kernel) + bias.squeeze(1) + x_l
        return x_l
