"""TorchRec's torchrec.streamable: the interfaces of what a train pipeline moves between devices and streams.

`Pipelineable` objects have `to(device, non_blocking)` and `record_stream(stream)`; a custom batch class written
for TorchRec's pipelines subclasses it. rectoolkit's JaggedTensor, KeyedJaggedTensor, KeyedTensor and Batch count
as Pipelineable (registered, as TorchRec's subclass it), and its pipelines take any batch with `.to`.

    >>> import torch
    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> isinstance(KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([1]), torch.tensor([1])), Pipelineable)
    True
"""

from __future__ import annotations

import abc

import torch

__all__ = ["Multistreamable", "Pipelineable"]


class Multistreamable(abc.ABC):
    """Can be marked as used on another CUDA stream (`torch.Tensor.record_stream`)."""

    @abc.abstractmethod
    def record_stream(self, stream: torch.Stream) -> None:
        ...


class Pipelineable(Multistreamable):
    """Can be moved to a device (`to` may return self or a copy: assign its result) and marked on streams."""

    @abc.abstractmethod
    def to(self, device: torch.device, non_blocking: bool) -> "Pipelineable":
        ...
