"""TorchRec's awaitables: LazyAwaitable, what the sharded collections' forward returns (resolve it with `.wait()`),
and its base Awaitable (with NoWait), which custom sharded modules return from input_dist.

TorchRec's sharded modules return an awaitable so that the output all-to-all can overlap with other work; the
model uses the result as if it were there (an attribute, an operator, a torch function waits for it). rectoolkit's
collectives have finished when forward returns, so its awaitables already hold their result, and `wait()` only
hands it over; they behave like TorchRec's otherwise (the same waiting on use), so model code written for either
runs unchanged.

    >>> class Ones(LazyAwaitable[list]):
    ...     def _wait_impl(self):
    ...         return [1, 1]
    >>> Ones().wait(), len(Ones()), Ones()[0]
    ([1, 1], 2, 1)

`callbacks` (TorchRec's) transform the result as `wait()` hands it over, in order:

    >>> ones = Ones()
    >>> ones.callbacks.append(lambda result: result + [2])
    >>> ones.wait(), NoWait(3).wait(), isinstance(ones, Awaitable)
    ([1, 1, 2], 3, True)
"""

from __future__ import annotations

import abc
import operator
from typing import Any, Callable, Generic, List, TypeVar

import torch

W = TypeVar("W")


class _NodeWhenTraced(type):
    """Building an awaitable from values torch.fx is tracing records that call in the graph (no instance)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        traced = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.fx.Proxy)]
        if traced:
            return traced[0].tracer.create_proxy("call_function", cls, args, kwargs)
        return super().__call__(*args, **kwargs)


class Awaitable(abc.ABC, Generic[W]):
    """A result to wait for: `wait()` runs `_wait_impl` (subclasses implement it), then each of `callbacks` on the
    result, in order. As TorchRec's, every wait() runs them again (LazyAwaitable keeps its result)."""

    def __init__(self) -> None:
        self._callbacks: List[Callable[[W], W]] = []

    @abc.abstractmethod
    def _wait_impl(self) -> W:
        """The result."""

    def wait(self) -> W:
        result = self._wait_impl()
        for callback in self.callbacks:
            result = callback(result)
        return result

    @property
    def callbacks(self) -> List[Callable[[W], W]]:
        return self._callbacks


class NoWait(Awaitable[W]):
    """An Awaitable of a value already at hand."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


class _LazyAwaitableMeta(_NodeWhenTraced, abc.ABCMeta):
    pass


class LazyAwaitable(Awaitable[W], metaclass=_LazyAwaitableMeta):
    """A deferred result: subclasses compute it in `_wait_impl`; `wait()` runs that once and keeps it.

    Using the awaitable as the result (an attribute or method of it, `[key]`, arithmetic, passing it to a torch
    function) waits first, as TorchRec's LazyAwaitable does. Under torch.fx tracing, building one from traced
    values becomes a node of the graph (as TorchRec's do).
    """

    def __init__(self) -> None:
        super().__init__()
        self._result: Any = None
        self._done = False

    def wait(self) -> W:
        if not self.__dict__.get("_done", False):
            if "_done" not in self.__dict__:
                raise RuntimeError(f"{type(self).__name__} was not initialized: call super().__init__() in its "
                                   "__init__")
            self._result = super().wait()
            self._done = True
        return self._result

    @staticmethod
    def _resolve(value: Any) -> Any:
        return value.wait() if isinstance(value, LazyAwaitable) else value

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = torch.fx.node.map_aggregate(args, LazyAwaitable._resolve)
        kwargs = torch.fx.node.map_aggregate(kwargs or {}, LazyAwaitable._resolve)
        return func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_result", "_done", "_callbacks", "_abc_impl"):  # copy/pickle probes; an uninitialized instance
            raise AttributeError(name)
        return getattr(self.wait(), name)

    def __getitem__(self, key: Any) -> Any:
        return self.wait()[key]

    def __iter__(self):
        return iter(self.wait())

    def __len__(self) -> int:
        return len(self.wait())

    def __contains__(self, item: Any) -> bool:
        return item in self.wait()


def _binary(op):
    def method(self, other):
        return op(LazyAwaitable._resolve(self), LazyAwaitable._resolve(other))
    return method


def _reflected(op):
    def method(self, other):
        return op(LazyAwaitable._resolve(other), LazyAwaitable._resolve(self))
    return method


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor"):
    _op = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    setattr(LazyAwaitable, f"__{_name}__", _binary(_op))
    setattr(LazyAwaitable, f"__r{_name}__", _reflected(_op))
setattr(LazyAwaitable, "__neg__", lambda self: -LazyAwaitable._resolve(self))


class Ready(LazyAwaitable[W]):
    """An awaitable whose result is already computed (TorchRec's LazyNoWait)."""

    def __init__(self, obj: W) -> None:  # (TorchRec's argument name)
        super().__init__()
        self._ready = obj

    def _wait_impl(self) -> W:
        return self._ready


class EmbeddingBagCollectionAwaitable(Ready):
    """The output of a sharded EmbeddingBagCollection: `.wait()` gives the KeyedTensor."""


class EmbeddingCollectionAwaitable(Ready):
    """The output of a sharded EmbeddingCollection: `.wait()` gives {feature: JaggedTensor}."""


LazyNoWait = Ready
