"""Instrumented collectives: every byte a rank sends to every other rank, per collective, per step.

All sharded modules talk through one `ShardingEnv` (TorchRec's name): rank, world size, ranks per host, the
process group, and a `CommStats` that counts the bytes of every all-to-all this rank starts. Counts are
logical payload bytes (the `rectoolkit.plan.traffic` protocol), the same on gloo and on NCCL.

    >>> env = ShardingEnv.local()          # world size 1, no process group needed
    >>> out = all_to_all(env, torch.arange(3), [3], [3], "input_dist")
    >>> out.tolist(), env.stats.bytes_sent["input_dist"].tolist()
    ([0, 1, 2], [24])

`all_to_all` has no gradient (ids, lengths); `all_to_all_messages` sends several typed tensors per rank in one
all-to-all (ids and lengths together); `all_to_all_with_grad` sends gradients back the transposed way and
counts them under ``name + "_backward"``. gloo has no reduce-scatter, so reductions are written as an
all-to-all followed by a local sum (row_wise.py, table_row_wise.py).

`CommStats.wait_s` is the time this rank spent blocked in each collective (a blocking call, or the `wait()` of
one started with `start_all_to_all_messages`, which the train pipeline uses to send the next batch's ids while
this batch computes): the time lost to communication and to waiting for slower peers.

TorchRec's host helpers (get_local_size, get_local_rank, get_group_rank, get_num_groups, intra_and_cross_node_pg)
are importable from here too; they live in node_groups.py.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from rectoolkit.distributed.node_groups import (get_group_rank, get_local_rank, get_local_size,  # noqa: F401
                                                get_node_group_size, get_num_groups, intra_and_cross_node_pg)


@dataclass
class CommStats:
    """Bytes this rank sent, per collective: name -> [world_size] vector indexed by destination rank; and the
    seconds it spent blocked in each collective (wait_s)."""

    world_size: int
    bytes_sent: Dict[str, np.ndarray] = field(default_factory=dict)
    calls: Dict[str, int] = field(default_factory=dict)
    wait_s: Dict[str, float] = field(default_factory=dict)

    def record(self, name: str, bytes_to: Sequence[int]) -> None:
        row = self.bytes_sent.get(name)
        if row is None:
            row = self.bytes_sent[name] = np.zeros(self.world_size, dtype=np.int64)
        row += np.asarray(bytes_to, dtype=np.int64)
        self.calls[name] = self.calls.get(name, 0) + 1

    def record_wait(self, name: str, seconds: float) -> None:
        self.wait_s[name] = self.wait_s.get(name, 0.0) + seconds

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.calls.clear()
        self.wait_s.clear()

    def total_wait_s(self) -> float:
        """Seconds blocked in collectives, over all of them."""
        return float(sum(self.wait_s.values()))

    def total_bytes(self, names: Optional[Sequence[str]] = None) -> int:
        """Bytes sent over all collectives, or over those in `names`."""
        return int(sum(int(row.sum()) for name, row in self.bytes_sent.items() if names is None or name in names))


@dataclass
class ShardingEnv:
    """Where this process sits: world size, rank, process group (TorchRec's arguments, in its order), ranks per
    host (local_world_size, default: all on one host), device.

    `local_world_size` only decides the two-level collectives of TABLE_ROW_WISE and GRID_SHARD
    (host(r) = r // local_world_size), so 4 processes on one machine can play 2 hosts of 2 ranks.
    TorchRec's `output_dtensor=True` (state_dict entries as DTensors) is refused: state_dict holds plain
    tensors of each rank's shards here.
    """

    world_size: int
    rank: int
    pg: Optional[dist.ProcessGroup] = None
    output_dtensor: bool = False
    local_world_size: Optional[int] = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    stats: CommStats = field(init=False)

    def __post_init__(self) -> None:
        if self.output_dtensor:
            raise NotImplementedError("ShardingEnv(output_dtensor=True): rectoolkit's state_dict holds each rank's "
                                      "shards as plain tensors, not DTensors; leave output_dtensor=False")
        if self.local_world_size is None:
            self.local_world_size = self.world_size
        self.device = torch.device(self.device)
        if self.local_world_size <= 0 or self.world_size % self.local_world_size:
            raise ValueError(
                f"ShardingEnv: world_size {self.world_size} is not a multiple of local_world_size "
                f"{self.local_world_size}; pass local_world_size that divides the number of ranks"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"ShardingEnv: rank {self.rank} is not in 0..{self.world_size - 1}")
        self.stats = CommStats(self.world_size)

    @classmethod
    def from_process_group(cls, pg: Optional[dist.ProcessGroup] = None, local_world_size: Optional[int] = None,
                           device: Optional[torch.device] = None) -> "ShardingEnv":
        """The env of an initialized torch.distributed group (default group when pg is None)."""
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized; call dist.init_process_group first "
                               "(or use rectoolkit.launch, or ShardingEnv.local() for one process)")
        world_size = dist.get_world_size(pg)
        if local_world_size is None:
            import os

            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" \
                else torch.device("cpu")
        return cls(world_size, dist.get_rank(pg), pg, local_world_size=local_world_size, device=device)

    @classmethod
    def local(cls, device: str = "cpu") -> "ShardingEnv":
        """World size 1 without any process group (collectives become copies)."""
        return cls(1, 0, None, local_world_size=1, device=torch.device(device))

    @classmethod
    def from_local(cls, world_size: int, rank: int, device: str = "cpu") -> "ShardingEnv":
        """TorchRec's spelling of an env without a process group. rectoolkit runs several ranks only as real
        processes, so only world size 1 is possible here."""
        if world_size != 1 or rank != 0:
            raise ValueError(f"ShardingEnv.from_local({world_size}, {rank}): without a process group rectoolkit runs "
                             "world size 1 only; for more ranks start processes (rtk.launch or torchrun) and use "
                             "ShardingEnv.from_process_group()")
        return cls.local(device)

    def with_group(self, pg: Optional[dist.ProcessGroup]) -> "ShardingEnv":
        """This env on another process group of the same ranks, counting into the same stats (the train
        pipeline sends the next batch's ids on a group of its own)."""
        other = copy.copy(self)
        other.pg = pg
        return other

    @property
    def process_group(self) -> Optional[dist.ProcessGroup]:
        """TorchRec's name for `pg`."""
        return self.pg

    @property
    def host(self) -> int:
        return self.rank // self.local_world_size

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_world_size

    def gathered_bytes(self) -> Dict[str, np.ndarray]:
        """name -> [W, W] bytes matrix (source, destination) over all ranks. Collective: every rank calls it."""
        names = sorted(self.stats.bytes_sent)
        rows = [(name, self.stats.bytes_sent[name].tolist()) for name in names]
        if self.world_size == 1:
            gathered = [rows]
        else:
            gathered = [None] * self.world_size
            dist.all_gather_object(gathered, rows, group=self.pg)
        out: Dict[str, np.ndarray] = {}
        for src, per_rank in enumerate(gathered):
            for name, row in per_rank:
                out.setdefault(name, np.zeros((self.world_size, self.world_size), dtype=np.int64))[src] = row
        return out


class PendingExchange:
    """A started all-to-all: `wait()` blocks until it has arrived (the time counted in `CommStats.wait_s`) and
    returns `finish(output)`."""

    def __init__(self, env: ShardingEnv, name: str, work, output: torch.Tensor,
                 finish: Callable[[torch.Tensor], object] = lambda output: output) -> None:
        self.env, self.name, self._work, self._output, self._finish = env, name, work, output, finish

    def wait(self):
        """Block until the exchange has arrived (once; the time is counted) and return finish(received)."""
        if self._work is not False:  # False: waited already
            started = time.perf_counter()
            if self._work is not None:  # None: nothing in flight (world size 1)
                self._work.wait()
            self.env.stats.record_wait(self.name, time.perf_counter() - started)
            self._work = False
        return self._finish(self._output)

    def then(self, step: Callable[[object], object]) -> "PendingExchange":
        """This exchange, with `step` applied to what wait() returns."""
        finish = self._finish
        self._finish = lambda output: step(finish(output))
        return self


def _start_exchange(env: ShardingEnv, tensor: torch.Tensor, input_splits: Sequence[int],
                    output_splits: Sequence[int], name: str, out: Optional[torch.Tensor] = None,
                    finish: Callable[[torch.Tensor], object] = lambda output: output,
                    comm: Optional[object] = None) -> PendingExchange:
    """Start one counted all_to_all_single of a 1-D tensor (splits in elements), into `out` when given; the
    pending exchange's wait() returns finish(received). `comm`: a custom all-to-all with TorchRec's interface
    (custom_all_to_all.All2AllSingle) that allocates both buffers and runs the exchange."""
    if len(input_splits) != env.world_size or len(output_splits) != env.world_size:
        raise ValueError(f"{name}: splits must have world_size={env.world_size} entries, got "
                         f"{len(input_splits)} and {len(output_splits)}")
    if tensor.numel() != sum(input_splits):
        raise ValueError(f"{name}: rank {env.rank} sends {tensor.numel()} elements but its splits sum to "
                         f"{sum(input_splits)}")
    env.stats.record(name, [s * tensor.element_size() for s in input_splits])
    if env.world_size == 1:
        return PendingExchange(env, name, None, out.copy_(tensor) if out is not None else tensor.clone(), finish)
    if comm is not None:
        output = comm.allocate((int(sum(output_splits)),), dtype=tensor.dtype, device=tensor.device)
        registered = comm.allocate(tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)
        registered.copy_(tensor)
        work = comm(output_tensor=output, input_tensor=registered, output_split_sizes=list(map(int, output_splits)),
                    input_split_sizes=list(map(int, input_splits)), group=env.pg, async_op=True)
        return PendingExchange(env, name, work, output, finish)
    output = out if out is not None else tensor.new_empty(int(sum(output_splits)))
    work = dist.all_to_all_single(output, tensor.contiguous(), list(map(int, output_splits)),
                                  list(map(int, input_splits)), group=env.pg, async_op=True)
    return PendingExchange(env, name, work, output, finish)


def _exchange(env: ShardingEnv, tensor: torch.Tensor, input_splits: Sequence[int],
              output_splits: Sequence[int], name: str, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One counted all_to_all_single of a 1-D tensor, waited for."""
    return _start_exchange(env, tensor, input_splits, output_splits, name, out).wait()


def all_reduce_sum(env: ShardingEnv, tensor: torch.Tensor, bytes_to: Sequence[int], name: str) -> None:
    """Sum `tensor` over ranks in place (no gradient), counted as `bytes_to` per destination: the caller states
    what the backend's all-reduce sends (rectoolkit.plan.traffic.allreduce_values_to: a ring's bytes)."""
    env.stats.record(name, bytes_to)
    if env.world_size > 1:
        started = time.perf_counter()
        dist.all_reduce(tensor, group=env.pg)
        env.stats.record_wait(name, time.perf_counter() - started)


def all_to_all(env: ShardingEnv, tensor: torch.Tensor, input_splits: Sequence[int],
               output_splits: Sequence[int], name: str, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Send tensor[split j] to rank j; receive output_splits[i] elements from each rank i (no gradient)."""
    return _exchange(env, tensor.detach(), input_splits, output_splits, name, out)


def start_all_to_all(env: ShardingEnv, tensor: torch.Tensor, input_splits: Sequence[int],
                     output_splits: Sequence[int], name: str, comm: Optional[object] = None) -> PendingExchange:
    """all_to_all, started: returns at once; `wait()` gives what all_to_all returns (`comm`: _start_exchange)."""
    return _start_exchange(env, tensor.detach(), input_splits, output_splits, name, comm=comm)


class _AllToAllWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, env, input_splits, output_splits, name, codecs):
        ctx.env, ctx.input_splits, ctx.output_splits, ctx.name, ctx.codecs = env, input_splits, output_splits, name, codecs
        if codecs is None:
            return _exchange(env, tensor, input_splits, output_splits, name)
        return codecs.forward.decode(_exchange(env, codecs.forward.encode(tensor), input_splits, output_splits, name))

    @staticmethod
    def backward(ctx, grad):
        codecs, name = ctx.codecs, ctx.name + "_backward"
        if codecs is None:
            back = _exchange(ctx.env, grad.contiguous(), ctx.output_splits, ctx.input_splits, name)
        else:
            back = codecs.backward.decode(_exchange(ctx.env, codecs.backward.encode(grad.contiguous()),
                                                    ctx.output_splits, ctx.input_splits, name))
        return back, None, None, None, None, None


def all_to_all_with_grad(env: ShardingEnv, tensor: torch.Tensor, input_splits: Sequence[int],
                         output_splits: Sequence[int], name: str, codecs=None) -> torch.Tensor:
    """all_to_all whose backward sends the gradients the transposed way (counted as name + "_backward").

    `codecs` (a QuantizedCommCodecs, rectoolkit.distributed.fbgemm_qcomm_codec): the values travel encoded by
    `codecs.forward` and the gradients by `codecs.backward` (e.g. float16 and bfloat16: 2 bytes each, counted so);
    both arrive decoded to float32. None: as they are.

        >>> from rectoolkit.distributed.fbgemm_qcomm_codec import CommType, QuantizedCommCodec, QuantizedCommCodecs
        >>> env = ShardingEnv.local()
        >>> half = QuantizedCommCodecs(QuantizedCommCodec(CommType.FP16), QuantizedCommCodec(CommType.BF16))
        >>> all_to_all_with_grad(env, torch.tensor([1 / 3]), [1], [1], "output_dist", half).item()
        0.333251953125
        >>> env.stats.bytes_sent["output_dist"].tolist()
        [2]
    """
    return _AllToAllWithGrad.apply(tensor, env, list(map(int, input_splits)), list(map(int, output_splits)), name,
                                   codecs)


def all_to_all_messages(env: ShardingEnv, messages: Sequence[Sequence[torch.Tensor]],
                        receive_numels: Sequence[Sequence[int]], name: str) -> List[torch.Tensor]:
    """One all-to-all of typed messages (no gradient): messages[j], a list of 1-D tensors (e.g. int64 ids, int32
    lengths), goes to rank j as one byte string; rank i's message to this rank has parts of receive_numels[i]
    elements with the same dtypes. Returns part k of every rank's message, concatenated in rank order.

    Counted bytes are the parts' own bytes, so sending lengths and ids together counts what sending them apart
    would; one collective instead of several saves a round trip per step.
    """
    return start_all_to_all_messages(env, messages, receive_numels, name).wait()


def start_all_to_all_messages(env: ShardingEnv, messages: Sequence[Sequence[torch.Tensor]],
                              receive_numels: Sequence[Sequence[int]], name: str) -> PendingExchange:
    """all_to_all_messages, started: returns at once; `wait()` gives the parts (the same as all_to_all_messages).

        >>> env = ShardingEnv.local()
        >>> pending = start_all_to_all_messages(env, [[torch.tensor([7, 8]), torch.tensor([2], dtype=torch.int32)]],
        ...                                     [[2, 1]], "input_dist")
        >>> [part.tolist() for part in pending.wait()]
        [[7, 8], [2]]
    """
    dtypes = [part.dtype for part in messages[0]]
    send_bytes = [sum(part.numel() * part.element_size() for part in message) for message in messages]
    piece_bytes = [n * dtype.itemsize for numels in receive_numels for n, dtype in zip(numels, dtypes)]
    flat = [part.detach().contiguous().view(torch.uint8) for message in messages for part in message]
    send = torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=env.device)

    def parts(received: torch.Tensor) -> List[torch.Tensor]:
        pieces = received.split(piece_bytes)
        return [torch.cat(pieces[k::len(dtypes)]).view(dtype) for k, dtype in enumerate(dtypes)]

    return _start_exchange(env, send, send_bytes, [sum(piece_bytes[k:k + len(dtypes)])
                                                   for k in range(0, len(piece_bytes), len(dtypes))], name,
                           finish=parts)


def to_ragged(matrix: torch.Tensor, block_rows: Sequence[int], widths: Sequence[int]) -> torch.Tensor:
    """Flatten a [rows, B] matrix cut into row blocks (block k: block_rows[k] rows), keeping the first widths[k]
    columns of block k: how blocks for ranks with different batch sizes are sent. Differentiable.

        >>> to_ragged(torch.arange(6.).view(2, 3), [1, 1], [1, 2]).tolist()
        [0.0, 3.0, 4.0]
    """
    B = matrix.shape[1]
    if all(w == B for w in widths):
        return matrix.reshape(-1)
    return _ToRagged.apply(matrix, *_merge_equal_widths(block_rows, widths))


def from_ragged(flat: torch.Tensor, block_rows: Sequence[int], widths: Sequence[int], B: int) -> torch.Tensor:
    """The inverse of to_ragged: [sum(block_rows), B], each block's missing columns zero. Differentiable.

        >>> from_ragged(torch.tensor([0., 3., 4.]), [1, 1], [1, 2], 3).tolist()
        [[0.0, 0.0, 0.0], [3.0, 4.0, 0.0]]
    """
    if all(w == B for w in widths):
        # reshape, not new_zeros, when empty: an empty block must stay in the autograd graph, or this rank skips
        # the backward collectives behind it while its peers wait in them
        return flat.reshape(sum(block_rows), B)
    return _FromRagged.apply(flat, *_merge_equal_widths(block_rows, widths), B)


def _copy_ragged(matrix: torch.Tensor, flat: torch.Tensor, block_rows: Sequence[int], widths: Sequence[int],
                 into_flat: bool) -> None:
    """Copy each block's first widths[k] columns between `matrix` and `flat` (one copy per block)."""
    row, start = 0, 0
    for r, w in zip(block_rows, widths):
        block, piece = matrix[row:row + r, :w], flat[start:start + r * w].view(r, w)
        (piece if into_flat else block).copy_(block if into_flat else piece)
        row, start = row + r, start + r * w


class _ToRagged(torch.autograd.Function):
    @staticmethod
    def forward(ctx, matrix, block_rows, widths):
        ctx.layout = (block_rows, widths, matrix.shape[1])
        flat = matrix.new_empty(sum(r * w for r, w in zip(block_rows, widths)))
        _copy_ragged(matrix, flat, block_rows, widths, into_flat=True)
        return flat

    @staticmethod
    def backward(ctx, grad):
        block_rows, widths, B = ctx.layout
        return _FromRagged.apply(grad, block_rows, widths, B), None, None


class _FromRagged(torch.autograd.Function):
    @staticmethod
    def forward(ctx, flat, block_rows, widths, B):
        ctx.layout = (block_rows, widths)
        matrix = flat.new_zeros(sum(block_rows), B)
        _copy_ragged(matrix, flat, block_rows, widths, into_flat=False)
        return matrix

    @staticmethod
    def backward(ctx, grad):
        return _ToRagged.apply(grad.contiguous(), *ctx.layout), None, None, None


def _merge_equal_widths(block_rows: Sequence[int], widths: Sequence[int]) -> Tuple[List[int], List[int]]:
    """Neighbouring blocks of one width as one block (fewer, larger copies; the flat layout is the same)."""
    rows: List[int] = []
    merged: List[int] = []
    for r, w in zip(block_rows, widths):
        if merged and merged[-1] == w:
            rows[-1] += r
        else:
            rows.append(r)
            merged.append(w)
    return rows, merged


# TorchRec's GRADIENT_DIVISION (torchrec.distributed.comm_ops): the sharded collections' output gradients are
# divided by the world size, so a table's gradient is the mean over ranks of their batches' gradients, as DDP
# averages the dense ones. False: summed over ranks.
_GRADIENT_DIVISION = [True]


def set_gradient_division(val: bool) -> None:
    """TorchRec's switch: divide the embedding gradients by the world size (True, the default) or sum them."""
    _GRADIENT_DIVISION[0] = bool(val)


def get_gradient_division() -> bool:
    return _GRADIENT_DIVISION[0]


def divide_gradient(output: torch.Tensor, env: ShardingEnv) -> torch.Tensor:
    """`output` (a sharded collection's output on this rank), its gradient divided by the world size in backward
    while get_gradient_division() (TorchRec divides in the backward of its output_dist collectives; the gradient
    is linear, so dividing it at the output is the same)."""
    if env.world_size > 1 and get_gradient_division() and output.requires_grad:
        world_size = env.world_size
        output.register_hook(lambda grad: grad / world_size)
    return output


def barrier(env: ShardingEnv) -> None:
    if env.world_size > 1:
        dist.barrier(group=env.pg)
