"""Cross networks of DCN (Wang et al., 2017 and 2020) with TorchRec's constructors and parameter names
(`torchrec.modules.crossnet`). Each layer crosses the input x_0 with the running x_l and adds x_l back:

    CrossNet          x_{l+1} = x_0 * (W_l x_l + b_l) + x_l          W_l: [N, N]
    LowRankCrossNet   x_{l+1} = x_0 * (U_l (V_l x_l) + b_l) + x_l    U_l: [N, r], V_l: [r, N]
    VectorCrossNet    x_{l+1} = x_0 (x_l . w_l) + b_l + x_l          w_l: [N]
    LowRankMixtureCrossNet  K low-rank experts E_k = x_0 * (U_k g(C_k g(V_k x_l)) + b_l), mixed by a softmax
                            gate over the K scores x_l . G_k, plus x_l (g: the activation)

    >>> import torch
    >>> CrossNet(in_features=6, num_layers=2)(torch.randn(3, 6)).shape
    torch.Size([3, 6])
    >>> sorted(LowRankCrossNet(6, num_layers=1, low_rank=2).state_dict())
    ['V_kernels.0', 'W_kernels.0', 'bias.0']
"""

from __future__ import annotations

from typing import Callable, Union

import torch
from torch import nn


def _xavier(*shape: int) -> nn.Parameter:
    return nn.Parameter(nn.init.xavier_normal_(torch.empty(*shape)))


def _zeros(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(*shape))


def _check_input(module: str, input: torch.Tensor, in_features: int, any_leading: bool = False) -> None:
    """[batch_size, in_features], or [..., in_features] with `any_leading` (LowRankCrossNet, as TorchRec's)."""
    if isinstance(input, torch.fx.Proxy):  # torch.fx.symbolic_trace: no shape to check, as TorchRec's trace
        return
    if input.dim() < 1 or input.shape[-1] != in_features or (input.dim() != 2 and not any_leading):
        leading = "..." if any_leading else "batch_size"
        raise ValueError(f"{module}: input has shape {list(input.shape)} but in_features={in_features}; "
                         f"pass a [{leading}, {in_features}] tensor")


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
    """Cross network whose [N, N] kernels are factored into W [N, low_rank] times V [low_rank, N];
    [..., in_features] -> [..., in_features] (any leading dimensions, as in TorchRec).

        >>> LowRankCrossNet(6, num_layers=2, low_rank=2)(torch.randn(2, 3, 6)).shape
        torch.Size([2, 3, 6])
    """

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
        _check_input("LowRankCrossNet", input, self._in_features, any_leading=True)
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


class LowRankMixtureCrossNet(nn.Module):
    """Mixture of `num_experts` low-rank cross layers (DCN-v2's DCN-Mix); one expert needs no gate."""

    def __init__(self, in_features: int, num_layers: int, num_experts: int = 1, low_rank: int = 1,
                 activation: Union[nn.Module, Callable[[torch.Tensor], torch.Tensor]] = torch.relu) -> None:
        super().__init__()
        _check_sizes("LowRankMixtureCrossNet", in_features, num_layers)
        if num_experts < 1 or low_rank < 1:
            raise ValueError(f"LowRankMixtureCrossNet: num_experts={num_experts} and low_rank={low_rank} "
                             f"must be at least 1")
        self._in_features = in_features
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._low_rank = low_rank
        self.U_kernels = nn.ParameterList([_xavier(num_experts, in_features, low_rank) for _ in range(num_layers)])
        self.V_kernels = nn.ParameterList([_xavier(num_experts, low_rank, in_features) for _ in range(num_layers)])
        self.bias = nn.ParameterList([_zeros(in_features, 1) for _ in range(num_layers)])
        self.gates = (nn.ModuleList([nn.Linear(in_features, 1, bias=False) for _ in range(num_experts)])
                      if num_experts > 1 else None)
        self._activation = activation
        self.C_kernels = nn.ParameterList([_xavier(num_experts, low_rank, low_rank) for _ in range(num_layers)])

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        _check_input("LowRankMixtureCrossNet", input, self._in_features)
        x_0 = input
        x_l = x_0
        for layer in range(self._num_layers):
            u, v, c = self.U_kernels[layer], self.V_kernels[layer], self.C_kernels[layer]
            experts = []
            for k in range(self._num_experts):
                low = self._activation(x_l @ v[k].T)            # [B, r]
                low = self._activation(low @ c[k].T)            # [B, r]
                experts.append(x_0 * (low @ u[k].T + self.bias[layer].squeeze(1)))  # [B, N]
            if self.gates is None:
                x_l = experts[0] + x_l
            else:
                scores = torch.cat([gate(x_l) for gate in self.gates], dim=1)  # [B, K]
                mixture = torch.softmax(scores, dim=1).unsqueeze(1)           # [B, 1, K]
                x_l = (torch.stack(experts, dim=2) * mixture).sum(dim=2) + x_l
        return x_l
