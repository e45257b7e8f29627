"""The data-parallel wrapper of DistributedModelParallel: DDP over the parameters outside the sharded collections.

TorchRec's `DataParallelWrapper` interface (one method, `wrap(dmp, env, device)`, which sets
`dmp._dmp_wrapped_module`) and its `DefaultDataParallelWrapper` with the same options and defaults: bucket_cap_mb 25,
static_graph True, find_unused_parameters False, allreduce_comm_precision None | "fp16" | "bf16" (the compress hooks),
params_to_ignore (more names DDP leaves alone), ddp_kwargs (passed on to DDP); buffers are not broadcast and
gradients are bucket views, as in TorchRec. One difference: DDP runs on a process group of its own, so that its
asynchronous all-reduces never interleave with the embedding all-to-alls.

A custom wrapper written for TorchRec runs unchanged: it may read `dmp._dmp_wrapped_module`, `env.process_group`
and `DistributedModelParallel._sharded_parameter_names(module)` (the names DDP must ignore).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv

if TYPE_CHECKING:
    from rectoolkit.distributed.model_parallel import DistributedModelParallel

COMM_PRECISIONS = (None, "fp16", "bf16")


class DataParallelWrapper(abc.ABC):
    """TorchRec's interface of a custom data-parallel wrapper: `wrap` sets `dmp._dmp_wrapped_module`."""

    @abc.abstractmethod
    def wrap(self, dmp: "DistributedModelParallel", env: ShardingEnv, device: torch.device) -> None:
        """Wrap `dmp._dmp_wrapped_module` (the model with its collections sharded) for data parallelism."""


class DefaultDataParallelWrapper(DataParallelWrapper):
    """DDP over every parameter outside the sharded collections, with TorchRec's options and defaults.

        >>> DefaultDataParallelWrapper(allreduce_comm_precision="int8")
        Traceback (most recent call last):
        ...
        ValueError: DefaultDataParallelWrapper: allreduce_comm_precision='int8' is not one of None, 'fp16', 'bf16'
    """

    def __init__(self, bucket_cap_mb: int = 25, static_graph: bool = True, find_unused_parameters: bool = False,
                 allreduce_comm_precision: Optional[str] = None, params_to_ignore: Optional[List[str]] = None,
                 ddp_kwargs: Optional[Dict[str, Any]] = None) -> None:
        if allreduce_comm_precision not in COMM_PRECISIONS:
            raise ValueError(f"DefaultDataParallelWrapper: allreduce_comm_precision={allreduce_comm_precision!r} is "
                             "not one of None, 'fp16', 'bf16'")
        self._bucket_cap_mb = bucket_cap_mb
        self._static_graph = static_graph
        self._find_unused_parameters = find_unused_parameters
        self._allreduce_comm_precision = allreduce_comm_precision
        self._additional_params_to_ignore = set(params_to_ignore or [])
        self._ddp_kwargs = dict(ddp_kwargs or {})

    def wrap(self, dmp: "DistributedModelParallel", env: ShardingEnv, device: torch.device) -> None:
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(dmp._dmp_wrapped_module, DistributedDataParallel):
            return
        module = dmp._dmp_wrapped_module
        ignore = set(type(dmp)._sharded_parameter_names(module)) | self._additional_params_to_ignore
        meta = [name for name, p in module.named_parameters() if name not in ignore and p.device.type == "meta"]
        if meta:  # TorchRec's DDP fails on them too ("Cannot copy out of meta tensor")
            raise NotImplementedError(
                f"DistributedModelParallel: parameter(s) {meta} are still on the meta device (init_parameters=False "
                "leaves them there) and DDP cannot replicate a tensor without data; materialize them first (e.g. "
                "dmp.module.<module>.to_empty(device=...) and initialize them) and then call init_data_parallel(), or "
                "build the DMP with init_parameters=True")
        dense = [p for name, p in module.named_parameters() if p.requires_grad and name not in ignore]
        if dense_world_size(env) == 1 or not dense:
            return
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, sorted(ignore))
        group = dense_group(env)
        options = dict(gradient_as_bucket_view=True, broadcast_buffers=False, static_graph=self._static_graph,
                       find_unused_parameters=self._find_unused_parameters, bucket_cap_mb=self._bucket_cap_mb)
        ddp = DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None,
                                      process_group=group, **{**options, **self._ddp_kwargs})
        if self._allreduce_comm_precision is not None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            hook = default_hooks.fp16_compress_hook if self._allreduce_comm_precision == "fp16" \
                else default_hooks.bf16_compress_hook
            ddp.register_comm_hook(None, hook)
        dmp._dmp_wrapped_module = ddp


_PART_GROUPS: Dict[Any, dist.ProcessGroup] = {}  # (world, ranks) -> the dense group of a part of the world


def dense_group(env: ShardingEnv) -> dist.ProcessGroup:
    """The process group the dense part's all-reduces run on: a new group of env's ranks, so that they never queue
    among the embedding collectives on env.pg. Made by every rank of the world when env's ranks are the whole world;
    a group of part of the world is made by its own ranks alone (the groups of a 2D layout make theirs at once),
    which torch allows once per set of ranks (it names the group after them): every DMP on those ranks shares it."""
    pg = env.process_group  # (env.pg, or a 2D layout's global group: its dense part is data-parallel over the world)
    ranks = dist.get_process_group_ranks(pg) if pg is not None else list(range(dist.get_world_size()))
    if len(ranks) == dist.get_world_size():
        return dist.new_group(ranks=ranks, backend=dist.get_backend(pg))
    key = (dist.group.WORLD, tuple(ranks), dist.get_backend(pg))
    if key not in _PART_GROUPS:
        _PART_GROUPS[key] = dist.new_group(ranks=ranks, backend=dist.get_backend(pg), use_local_synchronization=True)
    return _PART_GROUPS[key]


def dense_world_size(env: ShardingEnv) -> int:
    """How many ranks the dense part is data-parallel over: env's, or a 2D layout's whole world."""
    pg = env.process_group
    return dist.get_world_size(pg) if pg is not None and pg is not env.pg else env.world_size


def sharded_state_names(module: nn.Module, sharded: Iterable[nn.Module], extra: Iterable[str] = ()) -> List[str]:
    """The names, inside `module`, of the sharded collections' parameters and buffers (each rank's own shards,
    which DDP must leave alone), plus `extra`."""
    ids = {id(sub) for sub in sharded}
    names = list(extra)
    for path, sub in module.named_modules():
        if id(sub) in ids:
            names += [f"{path}.{name}" if path else name
                      for name, _ in list(sub.named_parameters()) + list(sub.named_buffers())]
    return names


def replicated_parameters(module: nn.Module, sharded: Mapping[str, nn.Module]) -> List[nn.Parameter]:
    """The parameters outside the sharded collections (the same on every rank, kept equal by DDP)."""
    shard_ids = {id(p) for sub in sharded.values() for p in sub.parameters()}
    return [p for p in module.parameters() if id(p) not in shard_ids]
