"""TorchRec's torchrec.distributed.dist_data: the modules a sharded module moves its data with.

    KJTAllToAll(pg, splits, stagger=1)(kjt)            keys cut into len(pg) blocks of splits[r] keys; rank r gets
                                                       block r of every rank's batch. Two waits, as TorchRec's:
                                                       .wait() -> KJTAllToAllTensorsAwaitable (the sizes have
                                                       arrived), .wait() -> the KeyedJaggedTensor.
    PooledEmbeddingsAllToAll(pg, dim_sum_per_rank)     comm_ops.alltoall_pooled as a module, with callbacks
    PooledEmbeddingsReduceScatter(pg)                  comm_ops.reduce_scatter_base_pooled (or _v_ with uneven
                                                       input_splits)
    PooledEmbeddingsAllGather(pg)                      comm_ops.all_gather_base_pooled
    SequenceEmbeddingsAllToAll(pg, features_per_rank)  comm_ops.alltoall_sequence as a module
    VariableBatchPooledEmbeddingsAllToAll(pg, dims)    comm_ops.variable_batch_alltoall_pooled as a module

Also here, from their own modules: one process feeding several devices (KJTOneToAll, EmbeddingsAllToOne, ...:
all_to_one.py) and plain tensors and JaggedTensors (TensorAllToAll, JaggedTensorAllToAll, ...: tensor_all_to_all.py).

The KJT's all-to-all sends its `dist_tensors` (lengths, values, [strides], [weights]) as one typed message per
rank, after a first all-to-all of their sizes and of each rank's batch size (`SplitsAllToAllAwaitable`); the
receiver rebuilds the KJT with `KeyedJaggedTensor.dist_init`, the (source rank, key) blocks put in key order by
`kjt_recat`. On one rank the input itself comes back (synced). The embeddings' modules are differentiable
(see comm_ops); the KJT's all-to-all carries no gradient, as in TorchRec.

    >>> kjt_recat(2, 4).tolist(), kjt_recat(2, 4, stagger=2).tolist(), kjt_recat(0, 4)
    ([0, 2, 4, 6, 1, 3, 5, 7], [0, 4, 2, 6, 1, 5, 3, 7], None)
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.distributed.awaitable import Awaitable
from rectoolkit.distributed.comm import PendingExchange, start_all_to_all, start_all_to_all_messages
from rectoolkit.distributed.comm_ops import (all_gather_base_pooled, alltoall_pooled, alltoall_sequence, env_of,
                                             invert_permute, reduce_scatter_base_pooled,
                                             reduce_scatter_v_per_feature_pooled, reduce_scatter_v_pooled,
                                             variable_batch_alltoall_pooled)
from rectoolkit.distributed.all_to_one import (EmbeddingsAllToOne, EmbeddingsAllToOneReduce, KJTList, KJTOneToAll,
                                               MergePooledEmbeddingsModule, SeqEmbeddingsAllToOne)
from rectoolkit.distributed.tensor_all_to_all import (JaggedTensorAllToAll, TensorAllToAll, TensorAllToAllSplitsAwaitable,
                                                     TensorAllToAllValuesAwaitable, TensorValuesAllToAll)
from rectoolkit.sparse import KeyedJaggedTensor


def kjt_recat(local_split: int, num_splits: int, stagger: int = 1, device: Optional[torch.device] = None,
              batch_size_per_rank: Optional[List[int]] = None) -> Optional[torch.Tensor]:
    """The order (int32) in which the received (source rank, key) blocks of a KJT all-to-all make its key-major
    layout (TorchRec's _get_recat): `local_split` keys from each of `num_splits` sources, the sources read in
    `stagger` interleaved groups. When the sources' batch sizes differ, one index per sample. None: no keys."""
    if local_split == 0:
        return None
    if stagger < 1 or num_splits % stagger:
        raise ValueError(f"KJTAllToAll: stagger={stagger} must be >= 1 and divide the {num_splits} ranks")
    per_group = num_splits // stagger
    source_order = [x + per_group * y for x in range(per_group) for y in range(stagger)]
    order = [key + source * local_split for key in range(local_split) for source in source_order]
    if batch_size_per_rank is not None and len(set(batch_size_per_rank)) > 1:
        block_sizes = [batch_size_per_rank[block // local_split] for block in range(num_splits * local_split)]
        starts = [0, *itertools.accumulate(block_sizes)]
        order = [starts[block] + sample for block in order for sample in range(block_sizes[block])]
    return torch.tensor(order, dtype=torch.int32, device=device)


class SplitsAllToAllAwaitable(Awaitable[List[List[int]]]):
    """The all-to-all of sizes: input_tensors[k][r] goes to rank r; wait() gives out[k][i], what rank i sent
    this rank in tensor k (TorchRec's)."""

    def __init__(self, input_tensors: List[torch.Tensor], pg: dist.ProcessGroup,
                 collective_tag: Optional[int] = None, collective_tag_parts: Any = None) -> None:
        super().__init__()
        if collective_tag is not None or collective_tag_parts is not None:
            raise NotImplementedError("SplitsAllToAllAwaitable(collective_tag=...): TorchRec's collective "
                                      "validation is not implemented in rectoolkit; leave both tags None")
        if not input_tensors:
            raise ValueError("SplitsAllToAllAwaitable: input_tensors is empty; pass at least one tensor of sizes")
        env = env_of(pg, "SplitsAllToAllAwaitable")
        self.num_workers = env.world_size
        self._num_tensors = len(input_tensors)
        stacked = torch.stack([tensor.to(torch.int64) for tensor in input_tensors], dim=1).reshape(-1)
        self._pending = start_all_to_all(env, stacked, [self._num_tensors] * env.world_size,
                                         [self._num_tensors] * env.world_size, "input_dist_splits")

    def _wait_impl(self) -> List[List[int]]:
        received = self._pending.wait().view(self.num_workers, self._num_tensors)
        return received.T.tolist()


class KJTAllToAllTensorsAwaitable(Awaitable[KeyedJaggedTensor]):
    """The started all-to-all of a KJT's tensors (TorchRec's arguments): wait() gives this rank's KJT."""

    def __init__(self, pg: dist.ProcessGroup, input: KeyedJaggedTensor, splits: List[int],
                 input_splits: List[List[int]], output_splits: List[List[int]], input_tensors: List[torch.Tensor],
                 labels: List[str], keys: List[str], device: torch.device, stagger: int,
                 stride_per_rank: Optional[List[int]]) -> None:
        super().__init__()
        env = env_of(pg, "KJTAllToAll")
        self._workers = env.world_size
        self._input, self._keys, self._stagger, self._stride_per_rank = input, keys, stagger, stride_per_rank
        # TorchRec's sequence shardings read the values' splits from here: label -> entries per rank
        self._input_splits = dict(zip(labels, input_splits))
        self._output_splits = dict(zip(labels, output_splits))
        self._recat = kjt_recat(splits[env.rank], len(splits), stagger, device, stride_per_rank)
        self._received: Optional[List[torch.Tensor]] = None
        self._input_tensors = list(input_tensors)
        self._pending: Optional[PendingExchange] = None
        if self._workers == 1:
            return
        for label, tensor, sizes in zip(labels, input_tensors, input_splits):
            if tensor.numel() != sum(sizes):
                raise ValueError(f"KJTAllToAll: rank {env.rank}'s {label} has {tensor.numel()} entries but its "
                                 f"splits {sizes} sum to {sum(sizes)}; check the KJT's lengths")
        messages = [[tensor.split(sizes)[destination] for tensor, sizes in zip(input_tensors, input_splits)]
                    for destination in range(env.world_size)]
        receive = [[sizes[source] for sizes in output_splits] for source in range(env.world_size)]
        self._pending = start_all_to_all_messages(env, messages, receive, "input_dist")

    def _arrived(self) -> List[torch.Tensor]:
        if self._received is None:
            assert self._pending is not None
            self._received = self._pending.wait()
        return self._received

    def clear_inputs(self) -> int:
        """Wait for the exchange, then free the input tensors' storage; returns the bytes freed (TorchRec's)."""
        if self._workers == 1:
            return 0
        self._arrived()
        freed = 0
        for tensor in self._input_tensors:
            freed += tensor.element_size() * tensor.numel()
            tensor.untyped_storage().resize_(0)
        self._input_tensors.clear()
        return freed

    def _wait_impl(self) -> KeyedJaggedTensor:
        if self._workers == 1:
            return self._input.sync()
        return type(self._input).dist_init(
            keys=self._keys, tensors=self._arrived(), variable_stride_per_key=self._input.variable_stride_per_key(),
            num_workers=self._workers, recat=self._recat, stride_per_rank=self._stride_per_rank,
            stagger=self._stagger)


class KJTAllToAllSplitsAwaitable(Awaitable[KJTAllToAllTensorsAwaitable]):
    """The started all-to-all of a KJT's sizes (TorchRec's arguments): wait() starts the tensors' all-to-all and
    gives its KJTAllToAllTensorsAwaitable."""

    def __init__(self, pg: dist.ProcessGroup, input: KeyedJaggedTensor, splits: List[int], labels: List[str],
                 tensor_splits: List[List[int]], input_tensors: List[torch.Tensor], keys: List[str],
                 device: torch.device, stagger: int) -> None:
        super().__init__()
        self._pg, self._input, self._splits, self._labels = pg, input, splits, labels
        self._input_splits, self._input_tensors, self._keys = tensor_splits, input_tensors, keys
        self._device, self._stagger = device, stagger
        self._workers = env_of(pg, "KJTAllToAll").world_size
        self._stride_per_rank = None if input.variable_stride_per_key() else [input.stride()] * self._workers
        self._splits_awaitable: Optional[SplitsAllToAllAwaitable] = None
        if self._workers == 1:
            return
        sizes = [torch.tensor(per_rank, device=device) for per_rank in tensor_splits]
        if not input.variable_stride_per_key():
            sizes.append(torch.tensor([input.stride()] * self._workers, device=device))
        self._splits_awaitable = SplitsAllToAllAwaitable(sizes, pg)

    def _wait_impl(self) -> KJTAllToAllTensorsAwaitable:
        output_splits, stride_per_rank = self._input_splits, self._stride_per_rank
        if self._splits_awaitable is not None:
            received = self._splits_awaitable.wait()
            if self._input.variable_stride_per_key():
                output_splits = received
            else:
                output_splits, stride_per_rank = received[:-1], received[-1]
        return KJTAllToAllTensorsAwaitable(
            pg=self._pg, input=self._input, splits=self._splits, input_splits=self._input_splits,
            output_splits=output_splits, input_tensors=self._input_tensors, labels=self._labels, keys=self._keys,
            device=self._device, stagger=self._stagger, stride_per_rank=stride_per_rank)


class KJTAllToAll(nn.Module):
    """Send each rank its block of a KJT's keys (TorchRec's): `splits[r]` consecutive keys go to rank r, the same
    splits on every rank; rank r gets its keys for the batches of all ranks, concatenated in rank order (in
    `stagger` interleaved groups of ranks when stagger > 1, as TABLE_ROW_WISE needs).

        a2a = KJTAllToAll(pg, splits=[2, 1])
        kjt = a2a(features).wait().wait()     # rank 0: the first two keys, batch = sum of the ranks' batches
    """

    def __init__(self, pg: dist.ProcessGroup, splits: List[int], stagger: int = 1) -> None:
        super().__init__()
        name = type(self).__name__
        world_size = env_of(pg, name).world_size
        if len(splits) != world_size:
            raise ValueError(f"{name}: splits={splits} has {len(splits)} entries but the process group has "
                             f"{world_size} ranks; give the number of keys for each rank")
        if stagger < 1 or world_size % stagger:
            raise ValueError(f"{name}: stagger={stagger} must be >= 1 and divide the {world_size} ranks")
        self._pg, self._splits, self._stagger = pg, list(splits), stagger
        self._splits_cumsum = [0, *itertools.accumulate(splits)]

    def forward(self, input: KeyedJaggedTensor) -> KJTAllToAllSplitsAwaitable:
        """Start sending `input`; the first wait() has the sizes, the second the KJT."""
        with torch.no_grad():
            if len(input.keys()) != sum(self._splits):
                raise ValueError(f"{type(self).__name__}: the KJT has {len(input.keys())} keys {input.keys()} but splits="
                                 f"{self._splits} sum to {sum(self._splits)}; order the keys by destination rank "
                                 "and give every key to one rank")
            rank = dist.get_rank(self._pg)
            return KJTAllToAllSplitsAwaitable(
                pg=self._pg, input=input, splits=self._splits, labels=input.dist_labels(),
                tensor_splits=input.dist_splits(self._splits), input_tensors=input.dist_tensors(),
                keys=input.keys()[self._splits_cumsum[rank]:self._splits_cumsum[rank + 1]], device=input.device(),
                stagger=self._stagger)


class KJEAllToAll(KJTAllToAll):
    """KJTAllToAll for embedding updates (TorchRec's name): a KJT whose weights carry what is written into each
    key's table, keys ordered by destination rank, sent the same way and waited for twice the same way (TorchRec
    1.8's is the same exchange under this name)."""


class PooledEmbeddingsAwaitable(Awaitable[torch.Tensor]):
    """The pooled embeddings a collective is bringing (TorchRec's): wait() gives them, through `callbacks`."""

    def __init__(self, tensor_awaitable: Awaitable[torch.Tensor]) -> None:
        super().__init__()
        self._tensor_awaitable = tensor_awaitable

    def _wait_impl(self) -> torch.Tensor:
        return self._tensor_awaitable.wait()


class PooledEmbeddingsAllToAll(nn.Module):
    """The pooled embeddings of this rank's tables for every rank's batch, [sum(batch), dim_sum_per_rank[rank]],
    to the ranks: each gets [its batch, sum(dim_sum_per_rank)] (comm_ops.alltoall_pooled; TorchRec's arguments,
    `callbacks` applied to every result). Without batch_size_per_rank the rows are cut evenly.

        a2a = PooledEmbeddingsAllToAll(pg, dim_sum_per_rank=[2, 1])
        pooled = a2a(local_embs).wait()       # [B_local, 3]; backward sends the gradients back
    """

    def __init__(self, pg: dist.ProcessGroup, dim_sum_per_rank: List[int], device: Optional[torch.device] = None,
                 callbacks: Optional[List[Callable[[torch.Tensor], torch.Tensor]]] = None,
                 codecs: Any = None) -> None:
        super().__init__()
        self._pg, self._dim_sum_per_rank, self._codecs = pg, dim_sum_per_rank, codecs
        self._callbacks: List[Callable[[torch.Tensor], torch.Tensor]] = [] if callbacks is None else callbacks
        self.register_buffer("_dim_sum_per_rank_tensor",
                             torch.tensor(dim_sum_per_rank, device=device, dtype=torch.int))
        self.register_buffer("_cumsum_dim_sum_per_rank_tensor",
                             torch.tensor(list(itertools.accumulate(dim_sum_per_rank)), device=device, dtype=torch.int))

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank: Optional[List[int]] = None
                ) -> PooledEmbeddingsAwaitable:
        """Start the all-to-all of `local_embs` (rows of batch_size_per_rank[r] samples for rank r)."""
        if not batch_size_per_rank:
            world_size = self._pg.size()
            if local_embs.size(0) % world_size:
                raise ValueError(f"PooledEmbeddingsAllToAll: {local_embs.size(0)} rows do not split evenly over "
                                 f"{world_size} ranks; pass batch_size_per_rank")
            batch_size_per_rank = [local_embs.size(0) // world_size] * world_size
        awaitable = PooledEmbeddingsAwaitable(alltoall_pooled(
            local_embs, batch_size_per_rank, self._dim_sum_per_rank, self._dim_sum_per_rank_tensor,
            self._cumsum_dim_sum_per_rank_tensor, group=self._pg, codecs=self._codecs))
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    @property
    def callbacks(self) -> List[Callable[[torch.Tensor], torch.Tensor]]:
        return self._callbacks


class VariableBatchPooledEmbeddingsAllToAll(nn.Module):
    """comm_ops.variable_batch_alltoall_pooled as a module (TorchRec's arguments; `callbacks` applied to every
    result): a batch that varies per feature, on flat tensors."""

    def __init__(self, pg: dist.ProcessGroup, emb_dim_per_rank_per_feature: List[List[int]],
                 device: Optional[torch.device] = None,
                 callbacks: Optional[List[Callable[[torch.Tensor], torch.Tensor]]] = None, codecs: Any = None) -> None:
        super().__init__()
        self._pg, self._emb_dim_per_rank_per_feature, self._codecs = pg, emb_dim_per_rank_per_feature, codecs
        self._callbacks: List[Callable[[torch.Tensor], torch.Tensor]] = [] if callbacks is None else callbacks

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank_per_feature: List[List[int]],
                batch_size_per_feature_pre_a2a: List[int]) -> PooledEmbeddingsAwaitable:
        awaitable = PooledEmbeddingsAwaitable(variable_batch_alltoall_pooled(
            local_embs, batch_size_per_rank_per_feature, batch_size_per_feature_pre_a2a,
            self._emb_dim_per_rank_per_feature, group=self._pg, codecs=self._codecs))
        awaitable.callbacks.extend(self._callbacks)
        return awaitable

    @property
    def callbacks(self) -> List[Callable[[torch.Tensor], torch.Tensor]]:
        return self._callbacks


class PooledEmbeddingsReduceScatter(nn.Module):
    """Partial sums [sum of the ranks' batches, D] to their ranks, summed there: rank r gets [its batch, D]
    (TorchRec's; reduce_scatter_base_pooled with equal rows per rank, reduce_scatter_v_pooled with uneven
    input_splits)."""

    def __init__(self, pg: dist.ProcessGroup, codecs: Any = None) -> None:
        super().__init__()
        self._pg, self._codecs = pg, codecs

    def forward(self, local_embs: torch.Tensor, input_splits: Optional[List[int]] = None
                ) -> PooledEmbeddingsAwaitable:
        if input_splits and len(set(input_splits)) > 1:
            return PooledEmbeddingsAwaitable(reduce_scatter_v_pooled(local_embs, input_splits, self._pg,
                                                                     codecs=self._codecs))
        return PooledEmbeddingsAwaitable(reduce_scatter_base_pooled(local_embs, self._pg, codecs=self._codecs))


class VariableBatchPooledEmbeddingsReduceScatter(nn.Module):
    """comm_ops.reduce_scatter_v_per_feature_pooled as a module (TorchRec's): a flat tensor of a batch that varies
    per feature, its chunk for rank r summed over the ranks on rank r."""

    def __init__(self, pg: dist.ProcessGroup, codecs: Any = None) -> None:
        super().__init__()
        self._pg, self._codecs = pg, codecs

    def forward(self, local_embs: torch.Tensor, batch_size_per_rank_per_feature: List[List[int]],
                embedding_dims: List[int]) -> PooledEmbeddingsAwaitable:
        return PooledEmbeddingsAwaitable(reduce_scatter_v_per_feature_pooled(
            local_embs, batch_size_per_rank_per_feature, embedding_dims, group=self._pg, codecs=self._codecs))


class PooledEmbeddingsAllGather(nn.Module):
    """Every rank's [B, D] stacked in rank order, [world_size * B, D], on every rank (TorchRec's)."""

    def __init__(self, pg: dist.ProcessGroup, codecs: Any = None) -> None:
        super().__init__()
        self._pg, self._codecs = pg, codecs

    def forward(self, local_emb: torch.Tensor) -> PooledEmbeddingsAwaitable:
        return PooledEmbeddingsAwaitable(all_gather_base_pooled(local_emb, self._pg, codecs=self._codecs))


class SequenceEmbeddingsAwaitable(Awaitable[torch.Tensor]):
    """The sequence embeddings a collective is bringing (TorchRec's): with `unbucketize_permute_tensor`, the rows
    are put back in the order of the ids before row-wise bucketization."""

    def __init__(self, tensor_awaitable: Awaitable[torch.Tensor], unbucketize_permute_tensor: Optional[torch.Tensor],
                 embedding_dim: int) -> None:
        super().__init__()
        self._tensor_awaitable = tensor_awaitable
        if unbucketize_permute_tensor is not None:
            self.callbacks.append(lambda rows: rows.view(-1, embedding_dim).index_select(0, unbucketize_permute_tensor))

    def _wait_impl(self) -> torch.Tensor:
        return self._tensor_awaitable.wait()


class SequenceEmbeddingsAllToAll(nn.Module):
    """The embeddings of the ids a KJTAllToAll brought, back to the ranks that sent the ids (TorchRec's;
    comm_ops.alltoall_sequence): `features_per_rank[r]` keys on rank r; forward takes the received KJT's
    lengths ([local keys, batch]), the ids sent to (input_splits) and received from (output_splits) each rank, and
    for a batch that differs per rank, batch_size_per_rank and the KJT's recat (sparse_features_recat)."""

    def __init__(self, pg: dist.ProcessGroup, features_per_rank: List[int], device: Optional[torch.device] = None,
                 codecs: Any = None) -> None:
        super().__init__()
        self._pg, self._codecs = pg, codecs
        world_size, local_split = pg.size(), features_per_rank[pg.rank()]
        # rows (key i, source j) are key-major received and source-major sent
        forward_recat = [j + i * world_size for j in range(world_size) for i in range(local_split)]
        self.register_buffer("_forward_recat_tensor", torch.tensor(forward_recat, device=device, dtype=torch.int))
        self.register_buffer("_backward_recat_tensor",
                             invert_permute(torch.tensor(forward_recat, device=device, dtype=torch.int)))

    def forward(self, local_embs: torch.Tensor, lengths: torch.Tensor, input_splits: List[int],
                output_splits: List[int], unbucketize_permute_tensor: Optional[torch.Tensor] = None,
                batch_size_per_rank: Optional[List[int]] = None,
                sparse_features_recat: Optional[torch.Tensor] = None) -> SequenceEmbeddingsAwaitable:
        variable_batch_size = batch_size_per_rank is not None and len(set(batch_size_per_rank)) > 1
        if sparse_features_recat is not None:
            forward_recat, backward_recat = invert_permute(sparse_features_recat), sparse_features_recat
        else:
            forward_recat, backward_recat = self._forward_recat_tensor, self._backward_recat_tensor
        awaitable = alltoall_sequence(local_embs, forward_recat, backward_recat, lengths, input_splits, output_splits,
                                      variable_batch_size, group=self._pg, codecs=self._codecs)
        return SequenceEmbeddingsAwaitable(awaitable, unbucketize_permute_tensor, local_embs.shape[1])


__all__ = [
    "EmbeddingsAllToOne", "EmbeddingsAllToOneReduce", "JaggedTensorAllToAll", "KJEAllToAll", "KJTAllToAll",
    "KJTAllToAllSplitsAwaitable", "KJTAllToAllTensorsAwaitable", "KJTList", "KJTOneToAll",
    "MergePooledEmbeddingsModule", "PooledEmbeddingsAllGather", "PooledEmbeddingsAllToAll",
    "PooledEmbeddingsAwaitable", "PooledEmbeddingsReduceScatter", "SeqEmbeddingsAllToOne",
    "SequenceEmbeddingsAllToAll", "SequenceEmbeddingsAwaitable", "SplitsAllToAllAwaitable", "TensorAllToAll",
    "TensorAllToAllSplitsAwaitable", "TensorAllToAllValuesAwaitable", "TensorValuesAllToAll",
    "VariableBatchPooledEmbeddingsAllToAll", "VariableBatchPooledEmbeddingsReduceScatter", "kjt_recat",
]
