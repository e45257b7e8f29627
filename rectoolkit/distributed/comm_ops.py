"""TorchRec's torchrec.distributed.comm_ops: the differentiable collectives a sharded module is built from.

Each op starts its exchange when called and returns an awaitable (a `Request`); `wait()` gives the result, which
is in the autograd graph: backward sends the gradient back the transposed way. All of them are one counted
all-to-all of rectoolkit.distributed.comm plus reshapes and sums around it (gloo has no reduce-scatter), so a
rank sends what the collective must move (counted in a CommStats of the call's own; the TorchRec signatures have
no place to hand one in):

    alltoall_pooled            [sum(batch_size_per_rank), D_local] rows to their ranks -> [B_r, sum(dim_sum_per_rank)]
    reduce_scatter_pooled      inputs[r] summed over ranks on rank r (backward: all-gather)
    reduce_scatter_base_pooled the same, the input cut into world_size equal chunks along dim 0
    reduce_scatter_v_pooled    the same, chunks of input_splits rows (_per_feature_: of a flat variable batch)
    all_gather_base_pooled     every rank's input, stacked along dim 0 (backward: reduce-scatter)
    alltoall_sequence          sequence embeddings back to the ranks their ids came from
    variable_batch_alltoall_pooled   alltoall_pooled of a batch that varies per feature, flat
    reduce_scatter_tensor, all_gather_into_tensor   TorchRec's custom ops as finished functions

As in TorchRec, the input gradient is divided by the world size while get_gradient_division() (read when backward
runs; with set_use_sync_collectives(True) when forward runs, and the result comes back already waited as a
NoWait), and one rank alone gets its input back untouched.

Codecs: None or rectoolkit's QuantizedCommCodecs (FP32/FP16/BF16: values cast for the wire and back); TorchRec's
or fbgemm's codec objects are refused. A reduce-scatter with codecs adds the decoded float32 parts (TorchRec on
NCCL adds them in the narrow type). A custom all-to-all (`all_to_all_single_comm`, TorchRec's All2AllSingle
interface: custom_all_to_all.py) runs the forward exchange of alltoall_pooled and variable_batch_alltoall_pooled.

    >>> get_use_sync_collectives()
    False
"""

from __future__ import annotations

import itertools
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from rectoolkit.distributed.awaitable import Awaitable, NoWait
from rectoolkit.distributed.comm import (ShardingEnv, all_to_all, get_gradient_division, set_gradient_division,
                                         start_all_to_all)
from rectoolkit.distributed.custom_all_to_all import (AllToAllSingle, All2AllSingle, Comm, DefaultAll2AllSingle,
                                                      DefaultAllocMixin, check_custom_comm)
from rectoolkit.distributed.fbgemm_qcomm_codec import QuantizedCommCodec, QuantizedCommCodecs
from rectoolkit.sparse.kjt_dist import permute_segments

W = TypeVar("W")

# TorchRec's USE_SYNC_COLLECTIVES: the ops finish before returning (a NoWait of the result)
_USE_SYNC_COLLECTIVES = [False]


def set_use_sync_collectives(val: bool) -> None:
    """TorchRec's switch: True makes every op here finish before it returns."""
    _USE_SYNC_COLLECTIVES[0] = bool(val)


def get_use_sync_collectives() -> bool:
    return _USE_SYNC_COLLECTIVES[0]


@contextmanager
def torchrec_use_sync_collectives() -> Iterator[None]:
    """set_use_sync_collectives(True) for the duration of the block."""
    before = get_use_sync_collectives()
    set_use_sync_collectives(True)
    try:
        yield
    finally:
        set_use_sync_collectives(before)


class _ModuleWithSwitches(types.ModuleType):
    """This module, with TorchRec's module globals GRADIENT_DIVISION and USE_SYNC_COLLECTIVES read and assigned
    through the switches (so `comm_ops.GRADIENT_DIVISION = False` does what it does in TorchRec)."""

    @property
    def GRADIENT_DIVISION(self) -> bool:
        return get_gradient_division()

    @GRADIENT_DIVISION.setter
    def GRADIENT_DIVISION(self, val: bool) -> None:
        set_gradient_division(val)

    @property
    def USE_SYNC_COLLECTIVES(self) -> bool:
        return get_use_sync_collectives()

    @USE_SYNC_COLLECTIVES.setter
    def USE_SYNC_COLLECTIVES(self, val: bool) -> None:
        set_use_sync_collectives(val)


sys.modules[__name__].__class__ = _ModuleWithSwitches


# ------------------------------------------------------------------------------------------------ TorchRec's infos
@dataclass
class All2AllPooledInfo:
    """What alltoall_pooled was called with (TorchRec's fields; the two tensors are only carried)."""

    batch_size_per_rank: List[int]
    dim_sum_per_rank: List[int]
    dim_sum_per_rank_tensor: Optional[Tensor]
    cumsum_dim_sum_per_rank_tensor: Optional[Tensor]
    codecs: Optional[QuantizedCommCodecs] = None


@dataclass
class VariableBatchAll2AllPooledInfo:
    """What variable_batch_alltoall_pooled is called with (TorchRec's fields)."""

    batch_size_per_rank_per_feature: List[List[int]]
    batch_size_per_feature_pre_a2a: List[int]
    emb_dim_per_rank_per_feature: List[List[int]]
    codecs: Optional[QuantizedCommCodecs] = None
    input_splits: Optional[List[int]] = None
    output_splits: Optional[List[int]] = None


@dataclass
class All2AllSequenceInfo:
    """What alltoall_sequence is called with (TorchRec's fields)."""

    embedding_dim: int
    lengths_after_sparse_data_all2all: Tensor
    forward_recat_tensor: Optional[Tensor]
    backward_recat_tensor: Tensor
    input_splits: List[int]
    output_splits: List[int]
    variable_batch_size: bool = False
    codecs: Optional[QuantizedCommCodecs] = None
    permuted_lengths_after_sparse_data_all2all: Optional[Tensor] = None


@dataclass
class All2AllVInfo:
    """TorchRec's description of an all-to-all of per-table pooled blocks (its field names, `B_global` included)."""

    dims_sum_per_rank: List[int]
    B_global: int
    B_local: int
    B_local_list: List[int]
    D_local_list: List[int]
    input_split_sizes: List[int] = field(default_factory=list)
    output_split_sizes: List[int] = field(default_factory=list)
    codecs: Optional[QuantizedCommCodecs] = None


@dataclass
class ReduceScatterInfo:
    """The input sizes of reduce_scatter_pooled (TorchRec's fields)."""

    input_sizes: List[torch.Size]
    codecs: Optional[QuantizedCommCodecs] = None


@dataclass
class ReduceScatterBaseInfo:
    """The input size of reduce_scatter_base_pooled (TorchRec's fields)."""

    input_sizes: torch.Size
    codecs: Optional[QuantizedCommCodecs] = None


@dataclass
class AllGatherBaseInfo:
    """The input size of all_gather_base_pooled (TorchRec's fields)."""

    input_size: torch.Size
    codecs: Optional[QuantizedCommCodecs] = None


@dataclass
class ReduceScatterVInfo:
    """What reduce_scatter_v_pooled was called with (TorchRec's fields)."""

    input_sizes: List[List[int]]
    input_splits: List[int]
    equal_splits: bool
    total_input_size: List[int]
    codecs: Optional[QuantizedCommCodecs]


@dataclass
class All2AllDenseInfo:
    """TorchRec's description of a dense all-to-all (its fields)."""

    output_splits: List[int]
    batch_size: int
    input_shape: List[int]
    input_splits: List[int]


# ------------------------------------------------------------------------------------------------ the request
class Request(Awaitable[W]):
    """A collective started on process group `pg` (TorchRec's name): `wait()` gives its result, in the autograd
    graph. The ops here return one; waiting twice gives the same result."""

    def __init__(self, pg: Optional[dist.ProcessGroup], device: torch.device) -> None:
        super().__init__()
        self.pg = pg
        self.device = torch.device(device)
        self._arrive: Optional[Callable[[], W]] = None
        self._arrived: List[W] = []

    def _wait_impl(self) -> W:
        if not self._arrived:
            if self._arrive is None:
                raise RuntimeError("Request.wait(): no collective was started on this request; get requests from "
                                   "the comm_ops functions (alltoall_pooled, reduce_scatter_pooled, ...)")
            self._arrived.append(self._arrive())
            self._arrive = None
        return self._arrived[0]


class _GradientDivided(torch.autograd.Function):
    """Identity whose backward divides the gradient by the world size (TorchRec's GRADIENT_DIVISION): `divide`
    None reads the switch when backward runs, a bool is the switch read earlier."""

    @staticmethod
    def forward(ctx, tensor, world_size, divide):
        ctx.world_size, ctx.divide = world_size, divide
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        divide = get_gradient_division() if ctx.divide is None else ctx.divide
        return (grad / ctx.world_size if divide else grad), None, None


class _Arrived(torch.autograd.Function):
    """The output of an all-to-all started earlier (forward waits for it); backward sends the gradient back the
    transposed way, through the backward codec."""

    @staticmethod
    def forward(ctx, tensor, pending, env, input_splits, output_splits, name, codecs):
        ctx.env, ctx.splits, ctx.name, ctx.codecs = env, (input_splits, output_splits), name, codecs
        received = pending.wait()
        return received if codecs is None else codecs.forward.decode(received)

    @staticmethod
    def backward(ctx, grad):
        input_splits, output_splits = ctx.splits
        codecs, grad = ctx.codecs, grad.contiguous()
        wire = grad if codecs is None else codecs.backward.encode(grad)
        back = all_to_all(ctx.env, wire, output_splits, input_splits, ctx.name + "_backward")
        return (back if codecs is None else codecs.backward.decode(back)), None, None, None, None, None, None


def env_of(group: Optional[dist.ProcessGroup], subject: str) -> ShardingEnv:
    """The ShardingEnv of `group` (the default group when None), for an op named `subject`."""
    if not dist.is_initialized():
        raise RuntimeError(f"{subject}: torch.distributed is not initialized; call dist.init_process_group first "
                           "(or pass the process group the op runs on)")
    return ShardingEnv.from_process_group(group, local_world_size=1)


def check_codecs(codecs: Any, subject: str) -> Optional[QuantizedCommCodecs]:
    """`codecs` if None or rectoolkit's QuantizedCommCodecs; otherwise an error saying what to pass."""
    if codecs is None:
        return None
    if isinstance(codecs, QuantizedCommCodecs) and isinstance(codecs.forward, QuantizedCommCodec) \
            and isinstance(codecs.backward, QuantizedCommCodec):
        return codecs
    raise TypeError(f"{subject}(codecs={type(codecs).__name__}): pass None or rectoolkit's QuantizedCommCodecs "
                    "(rectoolkit.distributed.fbgemm_qcomm_codec.get_qcomm_codecs); TorchRec's and fbgemm's codec "
                    "objects are not run here")


def _open(name: str, group: Optional[dist.ProcessGroup], codecs: Any
          ) -> Tuple[ShardingEnv, Optional[QuantizedCommCodecs]]:
    """The env of op `name` on `group`, and its codecs checked (with more than one rank: one rank alone only gets
    its input back, as TorchRec's)."""
    env = env_of(group, name)
    if env.world_size > 1:
        codecs = check_codecs(codecs, name)
    return env, codecs


def start_request(env: ShardingEnv, tensor: Tensor, input_splits: Sequence[int], output_splits: Sequence[int],
                  name: str, codecs: Optional[QuantizedCommCodecs], finish: Callable[[Tensor], W],
                  comm: Any = None) -> Awaitable[W]:
    """Start the all-to-all of the 1-D `tensor` (splits in elements) and return the request whose wait() gives
    finish(received), differentiable; with the sync switch on, the NoWait of that result. `comm`: a custom
    all-to-all (custom_all_to_all.All2AllSingle) for the forward exchange."""
    sync = get_use_sync_collectives()
    input_splits, output_splits = list(map(int, input_splits)), list(map(int, output_splits))
    wire = tensor.detach().contiguous()
    pending = start_all_to_all(env, wire if codecs is None else codecs.forward.encode(wire), input_splits,
                               output_splits, name, comm=comm)
    request: Request[W] = Request(env.pg, tensor.device)
    request._arrive = lambda: finish(_Arrived.apply(tensor, pending, env, input_splits, output_splits, name, codecs))
    return NoWait(request.wait()) if sync else request


def divided(tensor: Tensor, env: ShardingEnv, division: Optional[bool] = None) -> Tensor:
    """`tensor`, its gradient divided by the world size in backward while get_gradient_division() (read then,
    or now with the sync switch on, as TorchRec), or as `division` says when given."""
    if division is None and get_use_sync_collectives():
        division = get_gradient_division()
    return _GradientDivided.apply(tensor, env.world_size, division)


def _check_world(env: ShardingEnv, subject: str, **per_rank: Sequence[Any]) -> None:
    """Each list in `per_rank` has one entry per rank, or an error names it."""
    for what, values in per_rank.items():
        if len(values) != env.world_size:
            raise ValueError(f"{subject}: {what} has {len(values)} entries but the process group has "
                             f"{env.world_size} ranks (rank {env.rank}); give one per rank")


# ------------------------------------------------------------------------------------------------ the ops
def alltoall_pooled(a2a_pooled_embs_tensor: Tensor, batch_size_per_rank: List[int], dim_sum_per_rank: List[int],
                    dim_sum_per_rank_tensor: Optional[Tensor] = None,
                    cumsum_dim_sum_per_rank_tensor: Optional[Tensor] = None,
                    group: Optional[dist.ProcessGroup] = None, codecs: Optional[QuantizedCommCodecs] = None,
                    all_to_all_single_comm: Any = None) -> Awaitable[Tensor]:
    """Pooled embeddings of this rank's tables for every rank's batch, [sum(batch_size_per_rank), D_local], to
    the ranks: rank r gets rows of its batch_size_per_rank[r] samples from every rank, side by side,
    [B_r, sum(dim_sum_per_rank)] (the two tensors TorchRec takes for its kernel are accepted and not needed)."""
    name = "alltoall_pooled"
    comm = check_custom_comm(all_to_all_single_comm, name)
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(a2a_pooled_embs_tensor)
    _check_world(env, name, batch_size_per_rank=batch_size_per_rank, dim_sum_per_rank=dim_sum_per_rank)
    rows, local_dim = a2a_pooled_embs_tensor.shape
    if rows != sum(batch_size_per_rank) or local_dim != dim_sum_per_rank[env.rank]:
        raise ValueError(f"{name}: rank {env.rank}'s embeddings are {list(a2a_pooled_embs_tensor.shape)} but "
                         f"batch_size_per_rank={batch_size_per_rank} and dim_sum_per_rank={dim_sum_per_rank} say "
                         f"[{sum(batch_size_per_rank)}, {dim_sum_per_rank[env.rank]}]; pass one row per sample "
                         "of every rank and this rank's dimension sum")
    local_batch = batch_size_per_rank[env.rank]
    output_splits = [local_batch * dim for dim in dim_sum_per_rank]

    def side_by_side(received: Tensor) -> Tensor:
        return torch.cat([part.view(local_batch, dim) for part, dim in zip(received.split(output_splits),
                                                                         dim_sum_per_rank)], dim=1)

    return start_request(env, divided(a2a_pooled_embs_tensor, env).reshape(-1),
                         [b * local_dim for b in batch_size_per_rank], output_splits, name, codecs, side_by_side, comm)


def variable_batch_alltoall_pooled(a2a_pooled_embs_tensor: Tensor, batch_size_per_rank_per_feature: List[List[int]],
                                   batch_size_per_feature_pre_a2a: List[int],
                                   emb_dim_per_rank_per_feature: List[List[int]],
                                   group: Optional[dist.ProcessGroup] = None,
                                   codecs: Optional[QuantizedCommCodecs] = None,
                                   all_to_all_single_comm: Any = None) -> Awaitable[Tensor]:
    """alltoall_pooled for a batch that varies per feature, on flat (1-D) tensors: rank r gets, for each of this
    rank's features f, batch_size_per_rank_per_feature[r][f] pooled rows of emb_dim_per_rank_per_feature[rank][f];
    this rank gets, per feature of every rank in rank order, batch_size_per_feature_pre_a2a rows of it. Returns
    the 1-D concatenation in that order (feature-major within each rank), as TorchRec's."""
    name = "variable_batch_alltoall_pooled"
    comm = check_custom_comm(all_to_all_single_comm, name)
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(a2a_pooled_embs_tensor)
    _check_world(env, name, batch_size_per_rank_per_feature=batch_size_per_rank_per_feature,
                 emb_dim_per_rank_per_feature=emb_dim_per_rank_per_feature)
    my_dims = emb_dim_per_rank_per_feature[env.rank]
    input_splits = [sum(b * d for b, d in zip(batches, my_dims)) for batches in batch_size_per_rank_per_feature]
    feature_dims = [dim for dims in emb_dim_per_rank_per_feature for dim in dims]
    if len(batch_size_per_feature_pre_a2a) != len(feature_dims):
        raise ValueError(f"{name}: batch_size_per_feature_pre_a2a has {len(batch_size_per_feature_pre_a2a)} entries "
                         f"but the ranks have {len(feature_dims)} features; give one per feature of every rank")
    sizes = [b * d for b, d in zip(batch_size_per_feature_pre_a2a, feature_dims)]
    starts = [0, *itertools.accumulate(len(dims) for dims in emb_dim_per_rank_per_feature)]
    output_splits = [sum(sizes[starts[r]:starts[r + 1]]) for r in range(env.world_size)]
    if a2a_pooled_embs_tensor.numel() != sum(input_splits):
        raise ValueError(f"{name}: rank {env.rank} has {a2a_pooled_embs_tensor.numel()} values but its features' "
                         f"batches and dimensions say {sum(input_splits)}; pass the flat pooled rows of each rank's "
                         "samples, feature by feature")
    return start_request(env, divided(a2a_pooled_embs_tensor, env).reshape(-1), input_splits, output_splits, name,
                         codecs, lambda received: received, comm)


def _sum_over_ranks(shape: Sequence[int]) -> Callable[[Tensor], Tensor]:
    """The received world_size parts of `shape`, summed (in rank order)."""
    numel = int(torch.Size(shape).numel())

    def total(received: Tensor) -> Tensor:
        parts = received.split(numel)
        out = parts[0]
        for part in parts[1:]:
            out = out + part
        return out.view(*shape)

    return total


def reduce_scatter_pooled(inputs: List[Tensor], group: Optional[dist.ProcessGroup] = None,
                          codecs: Optional[QuantizedCommCodecs] = None) -> Awaitable[Tensor]:
    """inputs[r] (one tensor per rank) summed over the ranks, on rank r; backward gives each inputs[r] the
    gradient of rank r's result."""
    name = "reduce_scatter_pooled"
    env, codecs = _open(name, group, codecs)
    _check_world(env, name, inputs=inputs)
    if env.world_size <= 1:
        return NoWait(inputs[env.rank])
    flat = divided(torch.cat([tensor.reshape(-1) for tensor in inputs]), env)
    mine = inputs[env.rank].shape
    return start_request(env, flat, [tensor.numel() for tensor in inputs], [mine.numel()] * env.world_size, name,
                         codecs, _sum_over_ranks(mine))


def _equal_chunks(input: Tensor, env: ShardingEnv, subject: str) -> List[int]:
    if input.dim() == 0 or input.shape[0] % env.world_size:
        raise ValueError(f"{subject}: the input's dim 0 ({list(input.shape)}) does not split into "
                         f"{env.world_size} equal chunks (rank {env.rank}); pass a multiple of the world size")
    return [input.shape[0] // env.world_size] * env.world_size


def reduce_scatter_v_pooled(input: Tensor, input_splits: List[int], group: Optional[dist.ProcessGroup] = None,
                            codecs: Optional[QuantizedCommCodecs] = None) -> Awaitable[Tensor]:
    """`input` cut along dim 0 into chunks of input_splits[r] rows; chunk r summed over the ranks, on rank r."""
    name = "reduce_scatter_v_pooled"
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(input)
    _check_world(env, name, input_splits=input_splits)
    return _reduce_scatter_chunks(env, name, input, input_splits, codecs)


def reduce_scatter_v_per_feature_pooled(input: Tensor, batch_size_per_rank_per_feature: List[List[int]],
                                        embedding_dims: List[int], group: Optional[dist.ProcessGroup] = None,
                                        codecs: Optional[QuantizedCommCodecs] = None) -> Awaitable[Tensor]:
    """reduce_scatter_v_pooled of a flat (1-D) tensor of a batch that varies per feature: the chunk for rank r
    holds batch_size_per_rank_per_feature[r][f] pooled rows of embedding_dims[f] per feature f."""
    name = "reduce_scatter_v_per_feature_pooled"
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(input)
    _check_world(env, name, batch_size_per_rank_per_feature=batch_size_per_rank_per_feature)
    splits = [sum(b * d for b, d in zip(batches, embedding_dims)) for batches in batch_size_per_rank_per_feature]
    return _reduce_scatter_chunks(env, name, input, splits, codecs)


def _reduce_scatter_chunks(env: ShardingEnv, name: str, input: Tensor, input_splits: List[int],
                           codecs: Optional[QuantizedCommCodecs], division: Optional[bool] = None) -> Awaitable[Tensor]:
    if input.dim() == 0 or sum(input_splits) != input.shape[0]:
        raise ValueError(f"{name}: the chunks for the ranks ({input_splits}) sum to {sum(input_splits)} but rank "
                         f"{env.rank}'s input has shape {list(input.shape)}; they must sum to its dim 0")
    row = int(torch.Size(input.shape[1:]).numel())
    mine = [input_splits[env.rank], *input.shape[1:]]
    return start_request(env, divided(input, env, division).reshape(-1), [rows * row for rows in input_splits],
                         [input_splits[env.rank] * row] * env.world_size, name, codecs, _sum_over_ranks(mine))


def reduce_scatter_base_pooled(input: Tensor, group: Optional[dist.ProcessGroup] = None,
                               codecs: Optional[QuantizedCommCodecs] = None) -> Awaitable[Tensor]:
    """`input` cut along dim 0 into world_size equal chunks; chunk r summed over the ranks, on rank r."""
    name = "reduce_scatter_base_pooled"
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(input)
    return _reduce_scatter_chunks(env, name, input, _equal_chunks(input, env, name), codecs)


def all_gather_base_pooled(input: Tensor, group: Optional[dist.ProcessGroup] = None,
                           codecs: Optional[QuantizedCommCodecs] = None) -> Awaitable[Tensor]:
    """Every rank's `input` (all of one shape), stacked along dim 0 in rank order; backward sums each rank's
    gradient of the whole over the ranks and keeps this rank's part."""
    name = "all_gather_base_pooled"
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(input)
    return _all_gather(env, name, input, codecs)


def _all_gather(env: ShardingEnv, name: str, input: Tensor, codecs: Optional[QuantizedCommCodecs],
                division: Optional[bool] = None) -> Awaitable[Tensor]:
    numel = input.numel()
    shape = [input.shape[0] * env.world_size, *input.shape[1:]] if input.dim() else [env.world_size]
    return start_request(env, divided(input, env, division).reshape(-1).repeat(env.world_size),
                         [numel] * env.world_size, [numel] * env.world_size, name, codecs,
                         lambda received: received.view(*shape))


def pg_name(pg: dist.ProcessGroup) -> str:
    """The name torch.distributed registered process group `pg` under (TorchRec's)."""
    return pg.group_name


def _group_named(group_name: str, group_size: int, subject: str) -> ShardingEnv:
    try:
        group = dist.distributed_c10d._resolve_process_group(group_name)
    except (KeyError, ValueError, RuntimeError) as error:
        raise ValueError(f"{subject}: no process group is named {group_name!r}; pass pg_name(pg)") from error
    env = env_of(group, subject)
    if env.world_size != group_size:
        raise ValueError(f"{subject}: group_size={group_size} but group {group_name!r} has {env.world_size} ranks; "
                         "pass its size")
    return env


def reduce_scatter_tensor(input: Tensor, reduceOp: str, group_size: int, group_name: str,
                          gradient_division: bool) -> Tensor:
    """TorchRec's torchrec::reduce_scatter_tensor, finished: `input` cut along dim 0 into group_size equal chunks,
    chunk r summed over the ranks on rank r; backward all-gathers the gradient, divided by group_size when
    gradient_division (not the global switch). Only reduceOp "sum"."""
    name = "reduce_scatter_tensor"
    if reduceOp.lower() != "sum":
        raise NotImplementedError(f"{name}(reduceOp={reduceOp!r}): rectoolkit reduces by \"sum\" only")
    env = _group_named(group_name, group_size, name)
    return _reduce_scatter_chunks(env, name, input, _equal_chunks(input, env, name), None,
                                  bool(gradient_division)).wait()


def all_gather_into_tensor(shard: Tensor, gather_dim: int, group_size: int, group_name: str,
                           gradient_division: bool) -> Tensor:
    """TorchRec's torchrec::all_gather_into_tensor, finished: every rank's `shard` stacked along dim 0; backward
    sums the gradient over the ranks (divided by group_size when gradient_division). TorchRec gathers along dim 0
    whatever gather_dim says, so gather_dim must be 0 here."""
    name = "all_gather_into_tensor"
    if gather_dim != 0:
        raise NotImplementedError(f"{name}(gather_dim={gather_dim}): TorchRec 1.8 gathers along dim 0 whatever "
                                  "gather_dim says; pass 0 (and move the dimension yourself)")
    env = _group_named(group_name, group_size, name)
    return _all_gather(env, name, shard, None, bool(gradient_division)).wait()


def invert_permute(permute: Tensor) -> Tensor:
    """The inverse of a permutation (fbgemm's invert_permute): out[permute[i]] = i.

        >>> invert_permute(torch.tensor([2, 0, 1], dtype=torch.int32)).tolist()
        [1, 2, 0]
    """
    inverse = torch.empty_like(permute)
    inverse[permute.long()] = torch.arange(permute.numel(), dtype=permute.dtype, device=permute.device)
    return inverse


def alltoall_sequence(a2a_sequence_embs_tensor: Tensor, forward_recat_tensor: Tensor, backward_recat_tensor: Tensor,
                      lengths_after_sparse_data_all2all: Tensor, input_splits: List[int], output_splits: List[int],
                      variable_batch_size: bool = False, group: Optional[dist.ProcessGroup] = None,
                      codecs: Optional[QuantizedCommCodecs] = None) -> Awaitable[Tensor]:
    """Sequence embeddings [ids received, D] back to the ranks the ids came from (the reverse of the input
    all-to-all): the rows, key-major as the received KJT holds them, are put in source-rank order by
    `forward_recat_tensor` (over the (key, source) rows of `lengths_after_sparse_data_all2all`, [local keys,
    batch], or over single samples when `variable_batch_size`), and rank r gets output_splits[r] ids' rows; this
    rank gets input_splits[r] from rank r. `backward_recat_tensor` must invert forward_recat (autograd uses that
    inverse)."""
    name = "alltoall_sequence"
    env, codecs = _open(name, group, codecs)
    if env.world_size <= 1:
        return NoWait(a2a_sequence_embs_tensor)
    _check_world(env, name, input_splits=input_splits, output_splits=output_splits)
    embeddings, lengths = a2a_sequence_embs_tensor, lengths_after_sparse_data_all2all
    dim = embeddings.shape[1]
    if embeddings.shape[0] != sum(output_splits):
        raise ValueError(f"{name}: rank {env.rank} has {embeddings.shape[0]} rows but output_splits={output_splits} "
                         f"sum to {sum(output_splits)}; pass the ids received from each rank")
    embeddings = divided(embeddings, env)
    if lengths.shape[0] > 0:
        permute = forward_recat_tensor.long()
        inverse_ok = backward_recat_tensor is not None and backward_recat_tensor.numel() == permute.numel() and \
            torch.equal(permute[backward_recat_tensor.long()], torch.arange(permute.numel(), device=permute.device))
        if not inverse_ok:
            raise ValueError(f"{name}: backward_recat_tensor is not the inverse of forward_recat_tensor "
                             f"({forward_recat_tensor.tolist()}); pass invert_permute(forward_recat_tensor)")
        rows = lengths.reshape(-1) if variable_batch_size else lengths.view(lengths.shape[0] * env.world_size, -1).sum(1)
        embeddings = permute_segments(embeddings, rows, permute)
    return start_request(env, embeddings.reshape(-1), [n * dim for n in output_splits],
                         [n * dim for n in input_splits], name, codecs, lambda received: received.view(-1, dim))


__all__ = [
    "All2AllSingle", "AllToAllSingle", "Comm", "DefaultAll2AllSingle", "DefaultAllocMixin",
    "All2AllDenseInfo", "All2AllPooledInfo", "All2AllSequenceInfo", "All2AllVInfo", "AllGatherBaseInfo",
    "ReduceScatterBaseInfo", "ReduceScatterInfo", "ReduceScatterVInfo", "Request", "VariableBatchAll2AllPooledInfo",
    "all_gather_base_pooled", "all_gather_into_tensor", "alltoall_pooled", "alltoall_sequence", "get_gradient_division",
    "get_use_sync_collectives", "invert_permute", "pg_name",
    "reduce_scatter_base_pooled", "reduce_scatter_pooled", "reduce_scatter_v_per_feature_pooled",
    "reduce_scatter_tensor", "reduce_scatter_v_pooled", "set_gradient_division",
    "set_use_sync_collectives", "torchrec_use_sync_collectives", "variable_batch_alltoall_pooled",
]
