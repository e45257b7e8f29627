"""The meta-device parameters a model keeps outside its sharded collections: TorchRec's
`DistributedModelParallel(init_parameters=...)`.

A model built on the meta device has no memory behind its weights. Sharding gives its collections real shards (each
table's init_fn, on every rank's own slice); what stays outside them (dense layers, buffers) is still meta. With
init_parameters=True (the default) the DMP gives those real memory on its device, as TorchRec does: a parameter
becomes an uninitialized tensor of its shape, a buffer zeros, and a module that had a meta parameter is reset with
its own `reset_parameters()` (children first, as `nn.Module.apply` visits them). With init_parameters=False they
stay on meta, for the caller to materialize (`to_empty` and an init of their own) before `init_data_parallel()`.

    >>> lin = torch.nn.Linear(2, 1, device="meta")
    >>> init_meta_parameters(lin, torch.device("cpu")); lin.weight.device.type
    'cpu'
"""

from __future__ import annotations

import torch
from torch import nn

from rectoolkit.distributed.sharded_ebc import ShardedCollection
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection


@torch.no_grad()
def init_meta_parameters(module: nn.Module, device: torch.device) -> None:
    """Give every meta parameter and buffer of `module` outside its sharded collections memory on `device`
    (TorchRec's DistributedModelParallel._init_parameters)."""
    for child in module.children():
        if not isinstance(child, ShardedCollection):  # its shards are real already
            init_meta_parameters(child, device)
    if isinstance(module, (EmbeddingBagCollection, EmbeddingCollection)):
        # a collection left unsharded: its weights are views of its kernel's storage, which to_empty rebuilds
        if any(p.device.type == "meta" for p in module.parameters()):
            module.to_empty(device=device)
            module.reset_parameters()
        return
    has_meta_parameter = False
    for name, param in module._parameters.items():
        if isinstance(param, torch.Tensor) and param.device.type == "meta":
            module._parameters[name] = nn.Parameter(torch.empty_like(param, device=device),
                                                    requires_grad=param.requires_grad)
            has_meta_parameter = True
    for name, buffer in module._buffers.items():
        if isinstance(buffer, torch.Tensor) and buffer.device.type == "meta":
            module._buffers[name] = torch.zeros_like(buffer, device=device)
    if has_meta_parameter and hasattr(module, "reset_parameters"):
        module.reset_parameters()


def move_dense_part(module: nn.Module, device: torch.device) -> None:
    """Move the parameters and buffers of `module` to `device`, leaving meta ones where they are (init_parameters=False
    keeps them for the caller; `.to()` would fail on them)."""
    module._apply(lambda tensor: tensor if tensor.device.type == "meta" else tensor.to(device))
