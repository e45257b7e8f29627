"""A launch's arguments, checked before any rank starts (each error names the argument, its value and what it must
be), and the defaults of the backend and of the threads per rank.

    >>> check_arguments(print, 2, "gloo", None, None, None, 120.0, 120.0, 3.0)
    'gloo'
    >>> check_arguments(print, 2, None, None, None, None, None, 120.0, -1)
    Traceback (most recent call last):
    ...
    ValueError: grace_s must be a number of seconds >= 0 (how long stopped ranks get before they are killed), got -1
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")  # the torch.distributed backends a local job runs on


def _positive_number(value: Any) -> bool:
    """A number > 0 (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def default_backend(world_size: int) -> str:
    """"nccl" when at least `world_size` GPUs are visible (and NCCL is built in), else "gloo"."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def default_num_threads(world_size: int) -> int:
    """CPU threads per worker: the machine's cores shared evenly, at least 1."""
    return max(1, (os.cpu_count() or 1) // world_size)


def check_arguments(fn: Callable[..., Any], world_size: int, backend: Optional[str], num_threads: Optional[int],
                    timeout_s: Optional[float], idle_timeout_s: Optional[float], straggler_timeout_s: Optional[float],
                    collective_timeout_s: float, grace_s: float) -> str:
    """Raise TypeError / ValueError for an argument `start` cannot run with; return the backend to use."""
    if not callable(fn):
        raise TypeError(f"launch: fn must be the function each rank runs, fn(ctx, *args), got a "
                        f"{type(fn).__name__} ({fn!r:.80})")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (the number of ranks), got {world_size!r}")
    for name, value in (("timeout_s", timeout_s), ("idle_timeout_s", idle_timeout_s),
                        ("straggler_timeout_s", straggler_timeout_s)):
        if value is not None and not _positive_number(value):
            raise ValueError(f"{name} must be a positive number of seconds or None (no limit), got {value!r}")
    if not _positive_number(collective_timeout_s) or collective_timeout_s == float("inf"):
        raise ValueError(f"collective_timeout_s must be a positive number of seconds (how long a collective may "
                         f"wait for its peers), got {collective_timeout_s!r}")
    if not (_positive_number(grace_s) or (isinstance(grace_s, (int, float)) and grace_s == 0)):
        raise ValueError(f"grace_s must be a number of seconds >= 0 (how long stopped ranks get before they are "
                         f"killed), got {grace_s!r}")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise ValueError(f"num_threads must be an int >= 1 (torch threads per rank) or None (the default), got "
                         f"{num_threads!r}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)} or None (nccl with a GPU per rank, else "
                         f"gloo), got {backend!r}")
    backend = backend or default_backend(world_size)
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs {world_size} visible GPUs but {torch.cuda.device_count()} "
                         f"are visible; use backend='gloo' or a smaller world_size")
    return backend
