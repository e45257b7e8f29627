"""What a worker function receives: its rank, the world size, its device, and `report(**metrics)`.

    >>> ctx = WorkerContext.single_process()
    >>> ctx.rank, ctx.world_size, str(ctx.device)
    (0, 1, 'cpu')
    >>> ctx.report(step=1, loss=0.5)   # single process: kept in ctx.history
    >>> ctx.history
    [{'step': 1, 'loss': 0.5}]
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch


def plain_metrics(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """Turn 0-d tensors / numpy scalars into Python numbers so metrics pickle small and print nicely."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        elif hasattr(value, "item") and getattr(value, "shape", None) == ():
            value = value.item()
        out[key] = value
    return out


def _picklable(value: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except BaseException:  # a __reduce__ may raise anything, KeyboardInterrupt included
        return False
    return True


@dataclass
class WorkerContext:
    """Handed to every worker function as its first argument.

    `report(**metrics)` sends a dict of metrics (step, loss, samples_per_s, bytes, ...) to the caller, where
    it arrives live with `rank` and `time_s` added. `stop_requested()` is True once the caller asked the
    job to stop cooperatively (`job.request_stop()`): a training loop can then finish its step and return.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str
    cpus: Optional[List[int]] = None  # the cores this worker is bound to (None: not bound); launch's cpu_binding
    _send: Optional[Callable[[Dict[str, Any]], None]] = field(default=None, repr=False)
    _stop_event: threading.Event = field(default_factory=threading.Event, repr=False)
    history: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @staticmethod
    def single_process(device: str = "cpu") -> "WorkerContext":
        """A context for running a worker function inline (rank 0 of 1, no process group needed)."""
        return WorkerContext(rank=0, world_size=1, local_rank=0, local_world_size=1,
                             device=torch.device(device), backend="none")

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the rank that usually prints and saves)."""
        return self.rank == 0

    def report(self, **metrics: Any) -> None:
        """Send metrics to the caller (or keep them in `history` when run inline)."""
        metrics = plain_metrics(metrics)
        if self._send is None:
            self.history.append(metrics)
            return
        try:
            self._send(metrics)
        except BaseException as exc:  # a metric's __reduce__ may raise anything; a real interrupt is re-raised
            unpicklable = [key for key, value in metrics.items() if not _picklable(value)]
            if not unpicklable:
                raise
            raise TypeError(f"ctx.report: metric(s) {unpicklable} cannot be pickled to the caller "
                            f"({type(exc).__name__}: {exc}); report numbers, strings, lists, dicts or "
                            f"tensors") from exc

    def stop_requested(self) -> bool:
        """True once the caller asked the job to stop; check it between steps and return early."""
        return self._stop_event.is_set()
