"""TorchRec's all-to-alls of plain tensors and JaggedTensors (torchrec.distributed.dist_data), for sharded modules
that move rows of their own (ids to look up, a KeyedJaggedTensorPool's items):

    TensorAllToAll(pg)(input, splits)                       splits[r] rows to rank r; first wait: the sizes have
                                                            arrived, second wait: the rows from every rank
    TensorValuesAllToAll(pg)(input, input_splits, output_splits)   the same when both sides know the sizes
    JaggedTensorAllToAll(jt, num_items_to_send, num_items_to_receive, pg)   a JaggedTensor's samples (lengths,
                                                            values, weights) to the ranks

Rows are whatever `input` holds along dim 0 (a 1-D tensor's entries, a 2-D tensor's rows); nothing here carries a
gradient, as in TorchRec. Each is one counted all-to-all of rectoolkit.distributed.comm.
"""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.distributed as dist

from rectoolkit.distributed.awaitable import Awaitable
from rectoolkit.distributed.comm import ShardingEnv, all_to_all, start_all_to_all, start_all_to_all_messages
from rectoolkit.distributed.comm_ops import env_of
from rectoolkit.sparse import JaggedTensor


def _per_rank(splits, env: ShardingEnv, subject: str, what: str) -> List[int]:
    values = [int(n) for n in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(values) != env.world_size:
        raise ValueError(f"{subject}: {what} has {len(values)} entries but the process group has {env.world_size} "
                         f"ranks (rank {env.rank}); give one per rank")
    return values


def _sums(counts: torch.Tensor, chunks: Sequence[int]) -> List[int]:
    return [int(part.sum()) for part in counts.split(list(chunks))]


class TensorAllToAllValuesAwaitable(Awaitable[torch.Tensor]):
    """The started all-to-all of `input`'s rows: input_splits[r] rows to rank r, output_splits[i] rows from rank i
    (TorchRec's arguments); wait() gives the received rows in rank order."""

    def __init__(self, pg: dist.ProcessGroup, input: torch.Tensor, input_splits: torch.Tensor,
                 output_splits: torch.Tensor, device: torch.device) -> None:
        super().__init__()
        subject = "TensorValuesAllToAll"
        env = env_of(pg, subject)
        self._input = input
        if env.world_size == 1:
            return
        sent, received = (_per_rank(input_splits, env, subject, "input_splits"),
                          _per_rank(output_splits, env, subject, "output_splits"))
        if sum(sent) != input.shape[0]:
            raise ValueError(f"{subject}: rank {env.rank} sends {input.shape[0]} rows but input_splits={sent} sum "
                             f"to {sum(sent)}")
        row = int(torch.Size(input.shape[1:]).numel())
        shape = [sum(received), *input.shape[1:]]
        self._pending = start_all_to_all(env, input.reshape(-1), [n * row for n in sent], [n * row for n in received],
                                         "tensor_all_to_all").then(lambda flat: flat.view(shape).to(device))

    def _wait_impl(self) -> torch.Tensor:
        return self._input if "_pending" not in self.__dict__ else self._pending.wait()


class TensorAllToAllSplitsAwaitable(Awaitable[TensorAllToAllValuesAwaitable]):
    """The started all-to-all of the row counts (`splits`, one per rank); wait() starts the rows' all-to-all and
    gives its TensorAllToAllValuesAwaitable (TorchRec's)."""

    def __init__(self, pg: dist.ProcessGroup, input: torch.Tensor, splits: torch.Tensor, device: torch.device) -> None:
        super().__init__()
        env = env_of(pg, "TensorAllToAll")
        self._pg, self._input, self._splits, self._device = pg, input, splits, device
        self._output_splits = splits
        if env.world_size > 1:
            counts = torch.tensor(_per_rank(splits, env, "TensorAllToAll", "splits"), dtype=torch.int64)
            ones = [1] * env.world_size
            self._pending = start_all_to_all(env, counts, ones, ones, "tensor_all_to_all_splits")

    def _wait_impl(self) -> TensorAllToAllValuesAwaitable:
        if "_pending" in self.__dict__:
            self._output_splits = self._pending.wait().to(device=self._device, dtype=torch.int)
        return TensorAllToAllValuesAwaitable(self._pg, self._input, self._splits, self._output_splits, self._device)


class TensorValuesAllToAll(torch.nn.Module):
    """Rows of a tensor to the ranks when both sides know the counts (TorchRec's): input_splits[r] rows to rank r,
    output_splits[i] rows from rank i; wait() gives them in rank order."""

    def __init__(self, pg: dist.ProcessGroup) -> None:
        super().__init__()
        self._pg = pg

    def forward(self, input: torch.Tensor, input_splits: torch.Tensor, output_splits: torch.Tensor
                ) -> TensorAllToAllValuesAwaitable:
        with torch.no_grad():
            return TensorAllToAllValuesAwaitable(self._pg, input, input_splits, output_splits, input.device)


class TensorAllToAll(torch.nn.Module):
    """Rows of a tensor to the ranks, splits[r] to rank r (TorchRec's): the first wait() has the counts each rank
    sends, the second the rows from every rank, in rank order."""

    def __init__(self, pg: dist.ProcessGroup) -> None:
        super().__init__()
        self._pg = pg

    def forward(self, input: torch.Tensor, splits: torch.Tensor) -> TensorAllToAllSplitsAwaitable:
        with torch.no_grad():
            return TensorAllToAllSplitsAwaitable(self._pg, input, splits, input.device)


class JaggedTensorAllToAll(Awaitable[JaggedTensor]):
    """A JaggedTensor's samples to the ranks (TorchRec's): num_items_to_send[r] samples to rank r,
    num_items_to_receive[i] from rank i (known ahead, usually from another all-to-all). The lengths travel at once;
    values and weights are started, and wait() gives the received JaggedTensor."""

    def __init__(self, jt: JaggedTensor, num_items_to_send: torch.Tensor, num_items_to_receive: torch.Tensor,
                 pg: dist.ProcessGroup) -> None:
        super().__init__()
        subject = "JaggedTensorAllToAll"
        env = env_of(pg, subject)
        send = _per_rank(num_items_to_send, env, subject, "num_items_to_send")
        receive = _per_rank(num_items_to_receive, env, subject, "num_items_to_receive")
        lengths = jt.lengths()
        if sum(send) != lengths.numel():
            raise ValueError(f"{subject}: rank {env.rank} has {lengths.numel()} samples but num_items_to_send={send} "
                             f"sum to {sum(send)}")
        self._lengths = all_to_all(env, lengths, send, receive, "jagged_all_to_all_lengths")
        values_sent, values_received = _sums(lengths, send), _sums(self._lengths, receive)
        parts = [jt.values()] + ([jt.weights()] if jt.weights_or_none() is not None else [])
        self._weighted = len(parts) == 2
        messages = [[part.split(values_sent)[rank] for part in parts] for rank in range(env.world_size)]
        self._pending = start_all_to_all_messages(env, messages, [[n] * len(parts) for n in values_received],
                                                  "jagged_all_to_all")

    def _wait_impl(self) -> JaggedTensor:
        received = self._pending.wait()
        return JaggedTensor(values=received[0], lengths=self._lengths,
                            weights=received[1] if self._weighted else None)


__all__ = ["JaggedTensorAllToAll", "TensorAllToAll", "TensorAllToAllSplitsAwaitable", "TensorAllToAllValuesAwaitable",
           "TensorValuesAllToAll"]
