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
from typing import Any, Callable, Dict, Optional, Union


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


__all__ = ["DeferrableMetrics"]
