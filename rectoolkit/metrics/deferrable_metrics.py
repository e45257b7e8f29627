"""`DeferrableMetrics` (TorchRec's `torchrec.metrics.deferrable_metrics`): what RecMetricModule.compute() returns -
a read-only-looking mapping of metric key -> value that is either already there or still a
`concurrent.futures.Future`.

    >>> from concurrent.futures import Future
    >>> ready = DeferrableMetrics({"ctr-click|lifetime_ctr": 0.5})
    >>> ready["ctr-click|lifetime_ctr"], ready.is_resolved()
    (0.5, True)
    >>> future = Future()
    >>> pending = DeferrableMetrics(future)
    >>> pending.update({"extra": 1})                 # merged when the future completes
    >>> seen = []
    >>> pending.subscribe(seen.append)
    >>> future.set_result({"ne-click|window_ne": 0.9})
    >>> seen, pending.resolve()
    ([{'ne-click|window_ne': 0.9, 'extra': 1}], {'ne-click|window_ne': 0.9, 'extra': 1})

Reading it like a dict (``[key]``, iteration, ``len``) waits for a pending future; ``subscribe`` does not.
Tensors merged in by ``update`` are stored on the CPU, as TorchRec stores them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

_DEVICE_TO_HOST_STREAMS: Dict[torch.device, Any] = {}  # one copy stream per GPU, made on first use


def device_supports_async(device: torch.device) -> bool:
    """TorchRec's: whether metric values on `device` can be copied to the host asynchronously (CUDA only)."""
    return device.type == "cuda"


def transfer_tensors_to_cpu(tensors: Dict[str, Any]) -> Tuple[Dict[str, Any], Optional[Any]]:
    """TorchRec's: ({key: value on the host}, a CUDA event that fires when the copies are done). CUDA tensors are
    copied into pinned host memory on a copy stream of their GPU, after what the current stream has queued, so
    training kernels do not wait for them; non-tensor values are kept. A dict without CUDA tensors comes back as it
    is, with no event. All tensors must be on one GPU (refused by name otherwise).

        >>> values = {"ne-click|window_ne": torch.tensor(0.9), "step": 3}
        >>> transfer_tensors_to_cpu(values) == (values, None)
        True
    """
    devices = {value.device for value in tensors.values() if isinstance(value, torch.Tensor)}
    gpus = [device for device in devices if device.type == "cuda"]
    if not gpus:
        return tensors, None
    if len(devices) > 1:
        raise ValueError(f"transfer_tensors_to_cpu: the tensors are on {sorted(str(d) for d in devices)}; pass "
                         "tensors of one GPU (move the others first)")
    device = gpus[0]
    if device not in _DEVICE_TO_HOST_STREAMS:
        _DEVICE_TO_HOST_STREAMS[device] = torch.cuda.Stream(device=device)
    stream = _DEVICE_TO_HOST_STREAMS[device]
    on_host: Dict[str, Any] = {}
    with torch.cuda.device(device):
        stream.wait_stream(torch.cuda.current_stream())  # the values' producers first
        with torch.cuda.stream(stream):
            for key, value in tensors.items():
                if isinstance(value, torch.Tensor):
                    on_host[key] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                    on_host[key].copy_(value, non_blocking=True)
                    value.record_stream(stream)  # its memory is not reused before the copy is done
                else:
                    on_host[key] = value
            done = torch.cuda.Event()
            done.record()
    return on_host, done


def _on_cpu(values: Dict[str, Any]) -> Dict[str, Any]:
    return {key: value.cpu() if hasattr(value, "cpu") and getattr(value, "is_cuda", False) else value
            for key, value in values.items()}


class DeferrableMetrics(Mapping):
    """Metric values now (a dict) or later (a Future of a dict); see the module doc."""

    def __init__(self, inner: Union[Dict[str, Any], "Future[Dict[str, Any]]"]) -> None:
        self._future: Optional[Future] = inner if isinstance(inner, Future) else None
        self._data: Dict[str, Any] = {} if self._future is not None else dict(inner)

    def is_resolved(self) -> bool:
        """True once the values are here (never blocks)."""
        return self._future is None

    def resolve(self) -> Dict[str, Any]:
        """The values, waiting for the future if it is still pending (its exception is raised here)."""
        if self._future is not None:
            self._data = dict(self._future.result())
            self._future = None
        return self._data

    def subscribe(self, callback: Callable[[Dict[str, Any]], None],
                  on_error: Optional[Callable[[Exception], None]] = None) -> None:
        """Call ``callback(values)`` now if resolved, else when the future completes; a failed future calls
        ``on_error(exception)`` (or raises in the future's callback thread if there is none)."""
        if self._future is None:
            callback(self._data)
            return

        def done(future: Future) -> None:
            try:
                values = future.result()
            except Exception as error:
                if on_error is None:
                    raise
                on_error(error)
                return
            callback(self.resolve() if future is self._future else dict(values))

        self._future.add_done_callback(done)

    def update(self, other: Union[Dict[str, Any], "DeferrableMetrics"]) -> None:
        """Merge ``other`` in: now if both are resolved, else when what is pending completes. Callbacks subscribed
        before a deferred update see the values without it (call update first)."""
        if isinstance(other, DeferrableMetrics):
            if other.is_resolved():
                self.update(other._data)
                return
            target = self._future

            def fail(error: Exception) -> None:
                if target is not None and not target.done():
                    target.set_exception(error)

            other.subscribe(self.update, on_error=fail)
            return
        if not isinstance(other, dict):
            raise TypeError(f"DeferrableMetrics.update: got {type(other).__name__}; pass a dict or DeferrableMetrics")
        staged = _on_cpu(other)
        if self._future is None:
            self._data.update(staged)
            return
        original, merged = self._future, Future()

        def merge(future: Future) -> None:
            try:
                merged.set_result({**future.result(), **staged})
            except Exception as error:
                merged.set_exception(error)

        original.add_done_callback(merge)
        self._future = merged

    def __bool__(self) -> bool:
        return True  # `metrics or {}` keeps a pending DeferrableMetrics, as TorchRec's

    def __setitem__(self, key: str, value: Any) -> None:
        self.resolve()[key] = value

    def __getitem__(self, key: str) -> Any:
        return self.resolve()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.resolve())

    def __len__(self) -> int:
        return len(self.resolve())

    def __repr__(self) -> str:
        return f"DeferrableMetrics(resolved, {len(self._data)} keys)" if self.is_resolved() else \
            "DeferrableMetrics(pending)"


__all__ = ["DeferrableMetrics", "device_supports_async", "transfer_tensors_to_cpu"]
