"""Where a rank sits among the hosts (TorchRec's `torchrec.distributed.comm` helpers): ranks per host from the
launcher's environment (LOCAL_WORLD_SIZE, LOCAL_RANK, or their MPI names, as torchrun and `rtk.launch` set them),
the host ("group") of a rank, and the intra-host and cross-host process groups.

    >>> import os
    >>> os.environ.update(LOCAL_WORLD_SIZE="4", LOCAL_RANK="1")
    >>> get_local_size(8), get_local_rank(8, rank=5), get_group_rank(8, rank=5), get_num_groups(8)
    (4, 1, 1, 2)
    >>> del os.environ["LOCAL_WORLD_SIZE"], os.environ["LOCAL_RANK"]

Without those variables TorchRec assumes 8 ranks per host, or the whole world when 8 does not divide it; so does
this (a warning says so).
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from rectoolkit.plan import constructors

logger = logging.getLogger(__name__)

_LOCAL_SIZE_NAMES = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE")
_LOCAL_RANK_NAMES = ("LOCAL_RANK", "MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")
_INTRA_PG: Optional[dist.ProcessGroup] = None
_CROSS_PG: Optional[dist.ProcessGroup] = None


def _env_int(names: Tuple[str, ...]) -> Optional[int]:
    for name in names:
        text = os.environ.get(name)
        if text is None:
            continue
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"environment variable {name}={text!r} is not an integer; unset it or set it to the "
                             "number the launcher means") from None
        if value >= 0:
            return value
    return None


def get_local_size(world_size: Optional[int] = None) -> int:
    """Ranks per host: LOCAL_WORLD_SIZE (or the MPI equivalents), else 8; the whole world when that does not
    divide it. `world_size` defaults to the process group's."""
    if world_size is None:
        world_size = dist.get_world_size()
    if _env_int(_LOCAL_SIZE_NAMES) is None:
        logger.warning("Could not determine LOCAL_WORLD_SIZE from environment; assuming 8 ranks per host (or "
                       "WORLD_SIZE when 8 does not divide it), as TorchRec")
    return constructors.get_local_size(world_size)


def get_node_group_size(world_size: Optional[int] = None) -> int:
    """Ranks per host (TorchRec's 2-D environments may set another; rectoolkit has none): get_local_size."""
    return get_local_size(world_size)


def get_local_rank(world_size: Optional[int] = None, rank: Optional[int] = None) -> int:
    """This rank's index on its host: LOCAL_RANK (or the MPI equivalents), else rank mod get_local_size."""
    local_size = get_local_size(world_size)
    local_rank = _env_int(_LOCAL_RANK_NAMES)
    if local_rank is None or local_rank >= local_size:
        logger.warning("Could not determine LOCAL_RANK from environment; falling back to rank % local size")
        local_rank = (dist.get_rank() if rank is None else rank) % local_size
    return local_rank


def get_group_rank(world_size: Optional[int] = None, rank: Optional[int] = None) -> int:
    """The host a rank is on, 0 .. get_num_groups() - 1: rank // get_local_size."""
    return (dist.get_rank() if rank is None else rank) // get_local_size(world_size)


def get_num_groups(world_size: Optional[int] = None) -> int:
    """The number of hosts: world size // get_local_size."""
    if world_size is None:
        world_size = dist.get_world_size()
    return world_size // get_local_size(world_size)


def intra_and_cross_node_pg(device: Optional[torch.device] = None, backend: Optional[str] = None
                            ) -> Tuple[Optional[dist.ProcessGroup], Optional[dist.ProcessGroup]]:
    """(this host's ranks, the ranks of the same local index on every host) as process groups, created once per
    process (every rank must call it: new groups are collectives). On a meta device: (None, None), as TorchRec.

    World 4, 2 ranks per host: rank 1's groups are [0, 1] and [1, 3]."""
    global _INTRA_PG, _CROSS_PG
    if device is not None and torch.device(device).type == "meta":
        return None, None
    if not dist.is_initialized():
        raise RuntimeError("intra_and_cross_node_pg: no default process group; call "
                           "torch.distributed.init_process_group first (rtk.launch does it for each worker)")
    world_size, my_rank = dist.get_world_size(), dist.get_rank()
    local_size = get_local_size(world_size)
    backend = backend or dist.get_backend()
    if _INTRA_PG is None:
        for host in range(world_size // local_size):
            group = dist.new_group(ranks=[host * local_size + r for r in range(local_size)], backend=backend)
            if host == my_rank // local_size:
                _INTRA_PG = group
        dist.barrier()
    if _CROSS_PG is None:
        for local_rank in range(local_size):
            group = dist.new_group(ranks=list(range(local_rank, world_size, local_size)), backend=backend)
            if local_rank == my_rank % local_size:
                _CROSS_PG = group
        dist.barrier()
    return _INTRA_PG, _CROSS_PG


__all__ = ["get_group_rank", "get_local_rank", "get_local_size", "get_node_group_size", "get_num_groups",
           "intra_and_cross_node_pg"]
