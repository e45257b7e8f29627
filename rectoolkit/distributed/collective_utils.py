"""TorchRec's collective control flow (torchrec.distributed.collective_utils), at TorchRec's path: run something on
one rank of a process group and give every rank its result.

- `is_leader(pg, leader_rank=0)`: whether this process is the group's leader (no group: a single process, rank 0);
- `invoke_on_rank_and_broadcast_result(pg, rank, func, *args)`: func runs on `rank` only; its result is pickled and
  broadcast (one broadcast_object_list), so every rank returns an equal object;
- `run_on_leader(pg, rank)`: the same as a decorator;
- `create_on_rank_and_share_result(pg, rank, creator, extractor, constructor)`: the creator's CPU tensors move to
  POSIX shared memory and the other ranks of the host map them (no copy); `pg` must hold ranks of one host.

`rank` is the rank within `pg` everywhere (TorchRec passes it to the broadcast as a global rank, which is the same
for the world group).

    >>> is_leader(None), is_leader(None, leader_rank=1)
    (True, False)
"""

from __future__ import annotations

from functools import wraps
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

__all__ = ["create_on_rank_and_share_result", "invoke_on_rank_and_broadcast_result", "is_leader", "run_on_leader"]


def is_leader(pg: Optional[dist.ProcessGroup], leader_rank: int = 0) -> bool:
    """Whether this process has rank `leader_rank` in pg; with no group, whether leader_rank is 0."""
    return leader_rank == 0 if pg is None else pg.rank() == leader_rank


def _check_rank(pg: dist.ProcessGroup, rank: int, function: str) -> None:
    if not 0 <= rank < pg.size():
        raise ValueError(f"{function}: rank={rank} is not in the process group (ranks 0..{pg.size() - 1} of its "
                         f"{pg.size()}); pass the rank, within pg, that should run the function")


def _broadcast_from(pg: dist.ProcessGroup, rank: int, payload: Any) -> Any:
    """payload of `rank` (a group rank), on every rank of pg."""
    holder = [payload]
    if pg.size() > 1:
        dist.broadcast_object_list(holder, group=pg, group_src=rank)
    return holder[0]


def invoke_on_rank_and_broadcast_result(pg: dist.ProcessGroup, rank: int, func: Callable[..., T], *args: Any,
                                        **kwargs: Any) -> T:
    """func(*args, **kwargs), run on `rank` of pg only; every rank returns its result (pickled and broadcast).

        new_id = invoke_on_rank_and_broadcast_result(pg, 0, allocate_id)
    """
    _check_rank(pg, rank, "invoke_on_rank_and_broadcast_result")
    return _broadcast_from(pg, rank, func(*args, **kwargs) if pg.rank() == rank else None)


def run_on_leader(pg: dist.ProcessGroup, rank: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator: the function runs on `rank` of pg and every rank gets its result.

        @run_on_leader(pg, 0)
        def allocate_id() -> int: ...
    """
    def decorate(func: Callable[..., T]) -> Callable[..., T]:
        @wraps(func)
        def on_leader(*args: Any, **kwargs: Any) -> T:
            return invoke_on_rank_and_broadcast_result(pg, rank, func, *args, **kwargs)

        return on_leader

    return decorate


# where one shared tensor lives: manager handle, storage handle, storage bytes, shape, stride, offset, dtype
_SharedTensor = Tuple[bytes, bytes, int, torch.Size, Tuple[int, ...], int, torch.dtype]


def _to_shared_memory(tensor: Optional[torch.Tensor], position: int) -> Optional[_SharedTensor]:
    if tensor is None:
        return None
    if tensor.device.type != "cpu":
        raise ValueError(f"create_on_rank_and_share_result: tensor {position} of the extractor's list is on "
                         f"{tensor.device}; only CPU tensors can live in shared memory: move it to the CPU first")
    # filename-based shared memory, which another process maps by name
    manager, handle, size = tensor.untyped_storage()._share_filename_cpu_()
    return (bytes(manager), bytes(handle), int(size), tensor.shape, tuple(tensor.stride()),
            int(tensor.storage_offset()), tensor.dtype)


def _from_shared_memory(where: Optional[_SharedTensor]) -> Optional[torch.Tensor]:
    if where is None:
        return None
    manager, handle, size, shape, stride, offset, dtype = where
    storage = torch.UntypedStorage._new_shared_filename_cpu(manager, handle, size)
    return torch.empty((), dtype=dtype).set_(storage, offset, shape, stride)


def create_on_rank_and_share_result(pg: dist.ProcessGroup, rank: int, creator: Callable[..., T],
                                    extractor: Callable[[T], List[Optional[torch.Tensor]]],
                                    constructor: Callable[[List[Optional[torch.Tensor]]], T],
                                    *args: Any, **kwargs: Any) -> T:
    """creator(*args, **kwargs) on `rank` of pg, whose result that rank returns; its tensors (`extractor(result)`,
    CPU only; None entries stay None) move to shared memory, and every other rank returns
    `constructor(tensors)` over the same memory (writes are seen by all). pg must hold ranks of one host.

        table = create_on_rank_and_share_result(intra_host_pg, 0, creator=lambda: torch.zeros(1000, 64),
                                                extractor=lambda t: [t], constructor=lambda ts: ts[0])
    """
    _check_rank(pg, rank, "create_on_rank_and_share_result")
    result: Any = None
    shared: Optional[List[Optional[_SharedTensor]]] = None
    if pg.rank() == rank:
        result = creator(*args, **kwargs)
        shared = [_to_shared_memory(tensor, position) for position, tensor in enumerate(extractor(result))]
    shared = _broadcast_from(pg, rank, shared)
    if pg.rank() == rank:
        return result
    return constructor([_from_shared_memory(where) for where in shared])
