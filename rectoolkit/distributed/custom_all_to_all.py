"""TorchRec's interface for a custom all-to-all (torchrec.distributed.comm_ops: Comm, All2AllSingle, DefaultAll2AllSingle,
AllToAllSingle).

A user hands `alltoall_pooled` / `variable_batch_alltoall_pooled` (comm_ops) an `all_to_all_single_comm`: an object
that allocates the exchange's buffers (`allocate(size, dtype=, device=)`) and runs the exchange
(`comm(output_tensor, input_tensor, output_split_sizes, input_split_sizes, group, async_op)`, returning a Work when
async), e.g. to place buffers in a communication library's memory pool or to trace the calls. The forward exchange
goes through it (rectoolkit still counts its bytes); the gradient goes back through rectoolkit's own all-to-all, as
TorchRec's does.

    >>> comm = DefaultAll2AllSingle()
    >>> comm.allocate((2, 3), dtype=torch.float16, device=torch.device("cpu")).shape
    torch.Size([2, 3])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, List, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["AllToAllSingle", "All2AllSingle", "Comm", "DefaultAll2AllSingle", "DefaultAllocMixin", "check_custom_comm"]


class Comm(ABC):
    """A communication primitive that allocates its own buffers (TorchRec's interface)."""

    @abstractmethod
    def allocate(self, size: Sequence[Union[int, torch.SymInt]], *, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
        """A buffer of `size` for the exchange."""


class All2AllSingle(Comm):
    """An all-to-all of one tensor: rank j gets input_split_sizes[j] elements (dim 0) of this rank's input, and this
    rank gets output_split_sizes[i] from rank i, in rank order, into `output_tensor`."""

    @abstractmethod
    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, output_split_sizes: Optional[List[int]] = None,
                 input_split_sizes: Optional[List[int]] = None, group: Optional[dist.ProcessGroup] = None,
                 async_op: bool = False) -> Optional[dist.Work]:
        """Run the exchange; with async_op, return the Work to wait on."""


class DefaultAllocMixin:
    """Buffers from torch's own allocator."""

    def allocate(self, size: Sequence[Union[int, torch.SymInt]], *, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
        return torch.empty(size, dtype=dtype, device=device)


class DefaultAll2AllSingle(DefaultAllocMixin, All2AllSingle):
    """torch.distributed.all_to_all_single with buffers from torch's allocator."""

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, output_split_sizes: Optional[List[int]] = None,
                 input_split_sizes: Optional[List[int]] = None, group: Optional[dist.ProcessGroup] = None,
                 async_op: bool = False) -> Optional[dist.Work]:
        return dist.all_to_all_single(output_tensor, input_tensor, output_split_sizes, input_split_sizes,
                                      group=group, async_op=async_op)


def check_custom_comm(comm: Any, subject: str) -> Any:
    """`comm` if None or an all-to-all with TorchRec's interface (rectoolkit's or TorchRec's All2AllSingle, or any
    object with `allocate` and a call of its signature); otherwise a TypeError saying what to pass."""
    if comm is None or (callable(comm) and callable(getattr(comm, "allocate", None))):
        return comm
    raise TypeError(f"{subject}(all_to_all_single_comm={type(comm).__name__}): pass None or an All2AllSingle "
                    "(rectoolkit.distributed.comm_ops.DefaultAll2AllSingle, or a subclass): an object with "
                    "allocate(size, dtype=, device=) and __call__(output_tensor, input_tensor, output_split_sizes, "
                    "input_split_sizes, group, async_op)")


class AllToAllSingle(torch.autograd.Function):
    """TorchRec's differentiable all-to-all of one tensor on the process group named `group_name` (of `group_size`
    ranks): forward sends input_split_sizes[j] rows to rank j and gets output_split_sizes[i] from rank i; backward
    sends the gradient back the transposed way, divided by group_size when `gradient_division`."""

    @staticmethod
    def forward(ctx, input: Tensor, output_split_sizes: List[int], input_split_sizes: List[int], group_name: str,
                group_size: int, gradient_division: bool) -> Tensor:
        group = dist.distributed_c10d._resolve_process_group(group_name)
        ctx.group, ctx.splits, ctx.group_size, ctx.gradient_division = (
            group, (list(output_split_sizes), list(input_split_sizes)), group_size, gradient_division)
        return _exchange_rows(input, list(output_split_sizes), list(input_split_sizes), group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        output_split_sizes, input_split_sizes = ctx.splits
        back = _exchange_rows(grad.contiguous(), input_split_sizes, output_split_sizes, ctx.group)
        if ctx.gradient_division:
            back = back / ctx.group_size
        return back, None, None, None, None, None


def _exchange_rows(tensor: Tensor, output_split_sizes: List[int], input_split_sizes: List[int],
                   group: dist.ProcessGroup) -> Tensor:
    if sum(input_split_sizes) != tensor.shape[0]:
        raise ValueError(f"AllToAllSingle: input_split_sizes={input_split_sizes} sum to {sum(input_split_sizes)} "
                         f"but the input has {tensor.shape[0]} rows; give the rows for each rank")
    output = tensor.new_empty((sum(output_split_sizes), *tensor.shape[1:]))
    dist.all_to_all_single(output, tensor.contiguous(), output_split_sizes, input_split_sizes, group=group)
    return output
