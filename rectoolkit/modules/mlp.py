"""`Perceptron` and `MLP` with TorchRec's constructors and state_dict names (`torchrec.modules.mlp`).

    >>> import torch
    >>> mlp = MLP(in_size=6, layer_sizes=[8, 4])
    >>> mlp(torch.randn(3, 6)).shape
    torch.Size([3, 4])
    >>> sorted(mlp.state_dict())[:2]
    ['_mlp.0._linear.bias', '_mlp.0._linear.weight']

`activation` is what TorchRec accepts: "relu", "sigmoid" or "swish_layernorm"; a module instance (shared by
every layer); a zero-argument factory such as `torch.nn.ReLU` (called once per layer, so nothing is shared);
or a tensor function such as `torch.relu` (the default).
"""

from __future__ import annotations

import inspect
from typing import Callable, List, Optional, Union

import torch
from torch import nn

from rectoolkit.modules.activation import SwishLayerNorm

Activation = Union[str, Callable[[], nn.Module], nn.Module, Callable[[torch.Tensor], torch.Tensor]]
STRING_ACTIVATIONS = ("relu", "sigmoid", "swish_layernorm")


class Perceptron(nn.Module):
    """One linear layer followed by an activation: [B, in_size] -> [B, out_size].

        >>> Perceptron(5, 3)(torch.randn(2, 5)).shape
        torch.Size([2, 3])
    """

    def __init__(self, in_size: int, out_size: int, bias: bool = True,
                 activation: Union[nn.Module, Callable[[torch.Tensor], torch.Tensor]] = torch.relu,
                 device: Optional[torch.device] = None, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self._in_size = in_size
        self._out_size = out_size
        self._linear = nn.Linear(in_size, out_size, bias=bias, device=device, dtype=dtype)
        self._activation_fn = activation

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():  # (torch.jit.script compiles TorchRec's forward: the check is left out)
            _check_input(input, self._in_size)
        return self._activation_fn(self._linear(input))


@torch.jit.unused
def _check_input(input: torch.Tensor, in_size: int) -> None:
    """The last dimension must be in_size (nothing to check while torch.fx.symbolic_trace traces a Proxy)."""
    if isinstance(input, torch.fx.Proxy):
        return
    if input.dim() < 1 or input.shape[-1] != in_size:
        raise ValueError(f"Perceptron: input has shape {list(input.shape)} but in_size={in_size}; "
                         f"the last dimension must be {in_size}")


def _is_factory(activation: Callable) -> bool:
    """True for a callable that takes no required argument (a module class or a `lambda: nn.ReLU()`)."""
    if isinstance(activation, type):
        return issubclass(activation, nn.Module)
    try:
        parameters = inspect.signature(activation).parameters.values()
    except (TypeError, ValueError):  # builtins such as torch.relu have no signature: a tensor function
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters)


def _layer_activation(activation: Activation, out_size: int, device: Optional[torch.device], dtype: torch.dtype):
    """The activation of one layer; factories are called here, so each layer gets its own module."""
    if activation == "relu":
        return torch.relu
    if activation == "sigmoid":
        return torch.sigmoid
    if activation == "swish_layernorm":  # in the layer's dtype (TorchRec 1.8 leaves it, and the layer, in float32)
        return SwishLayerNorm(out_size, device=device).to(dtype)
    if isinstance(activation, nn.Module):
        return activation
    if _is_factory(activation):
        module = activation()
        if not isinstance(module, nn.Module):
            raise ValueError(f"MLP: the activation factory {activation!r} returned {type(module).__name__}, "
                             f"not a torch.nn.Module; pass a module, a module factory or a tensor function")
        return module
    return activation


class MLP(nn.Module):
    """Perceptrons stacked: [B, in_size] -> [B, layer_sizes[-1]], the activation after every layer
    (after the last one too unless `activation_on_last=False`). No layers (`layer_sizes=[]`) is the identity,
    as in TorchRec."""

    def __init__(self, in_size: int, layer_sizes: List[int], bias: bool = True, activation: Activation = torch.relu,
                 device: Optional[torch.device] = None, dtype: torch.dtype = torch.float32,
                 activation_on_last: bool = True) -> None:
        super().__init__()
        if isinstance(activation, str) and activation not in STRING_ACTIVATIONS:
            raise ValueError(f"MLP: activation={activation!r} is not one of {list(STRING_ACTIVATIONS)}; "
                             f"pass one of those, a module, a module factory or a tensor function")
        if any(size <= 0 for size in layer_sizes):
            raise ValueError(f"MLP: layer_sizes={list(layer_sizes)} must all be positive")
        layers = []
        for index, out_size in enumerate(layer_sizes):
            last = index == len(layer_sizes) - 1
            layer_activation = (nn.Identity() if last and not activation_on_last
                                else _layer_activation(activation, out_size, device, dtype))
            layers.append(Perceptron(layer_sizes[index - 1] if index else in_size, out_size, bias=bias,
                                     activation=layer_activation, device=device, dtype=dtype))
        self._mlp = nn.Sequential(*layers)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._mlp(input)
