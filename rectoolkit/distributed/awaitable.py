"""TorchRec's LazyAwaitable, for code written against it (rectoolkit's sharded modules return results directly)."""

from typing import Generic, TypeVar

W = TypeVar("W")


class LazyAwaitable(Generic[W]):
    """TorchRec's deferred result: subclasses compute it in `_wait_impl`, and `wait()` runs that once.

    rectoolkit's sharded modules return their results directly (a KeyedTensor's `wait()` returns itself), so this
    class is only for code written against TorchRec's type.

        >>> class Ones(LazyAwaitable[list]):
        ...     def _wait_impl(self):
        ...         return [1, 1]
        >>> Ones().wait()
        [1, 1]
    """

    def __init__(self) -> None:
        self._result: "W | None" = None
        self._done = False

    def _wait_impl(self) -> W:
        raise NotImplementedError(f"{type(self).__name__} must implement _wait_impl() to return its result")

    def wait(self) -> W:
        if not self._done:
            self._result = self._wait_impl()
            self._done = True
        return self._result
