"""`SwishLayerNorm` (TorchRec's `torchrec.modules.activation`): x * sigmoid(LayerNorm(x)).

    >>> import torch
    >>> SwishLayerNorm(4)(torch.zeros(2, 4)).shape
    torch.Size([2, 4])
"""

from __future__ import annotations

from typing import List, Optional, Union

import torch
from torch import nn


class SwishLayerNorm(nn.Module):
    """Swish with a layer norm inside: `input * sigmoid(layer_norm(input))`, normalised over `input_dims`."""

    def __init__(self, input_dims: Union[int, List[int], torch.Size], device: Optional[torch.device] = None) -> None:
        super().__init__()
        self.norm = nn.Sequential(nn.LayerNorm(input_dims, device=device), nn.Sigmoid())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input * self.norm(input)
