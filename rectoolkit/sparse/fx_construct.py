"""The jagged types under torch.fx.symbolic_trace: built from traced values, or combined, in one node of the graph.

torch.fx traces a forward by running it on Proxy values. A KeyedJaggedTensor, JaggedTensor or KeyedTensor built
from Proxies (`KeyedJaggedTensor(keys, values=proxy, lengths=proxy)`, `from_lengths_sync`, ...) cannot run its
checks and caches on them (they branch on sizes), and `KeyedTensor.regroup` / `KeyedJaggedTensor.concat` cannot
read the keys and sizes of a Proxy. So the classes' `__new__` (`traced_construction`) and those static methods
(`traced_call`) record themselves as one call_function node when an argument is a Proxy and return its Proxy: the
graph builds (and checks) the object, or combines them, when it runs, and what the forward does with the result
next is traced as methods of that Proxy, as TorchRec's traced graphs do. Outside fx tracing nothing changes.

    >>> import torch, torch.fx
    >>> from rectoolkit.sparse import KeyedJaggedTensor
    >>> def ids_of_b(values, lengths):
    ...     return KeyedJaggedTensor(keys=["a", "b"], values=values, lengths=lengths)["b"].values()
    >>> traced = torch.fx.symbolic_trace(ids_of_b)
    >>> traced(torch.tensor([1, 2, 3]), torch.tensor([1, 1, 0, 1]))
    tensor([3])
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Tuple

import torch
import torch.fx
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

_CLASSES: Dict[str, type] = {}


def traced_construction(cls: type) -> type:
    """Class decorator: `cls(...)` with a Proxy among its arguments becomes one `construct` node."""
    _CLASSES[cls.__name__] = cls

    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        if _tracing_proxies(args, kwargs):
            return construct(klass.__name__, *args, **kwargs)
        return object.__new__(klass)

    cls.__new__ = staticmethod(__new__)  # type: ignore[assignment]
    return cls


def traced_call(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator of a static method of a traced_construction class: called with a Proxy among its arguments, it
    becomes one `call_static` node."""
    owner, name = function.__qualname__.split(".")

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _tracing_proxies(args, kwargs):
            return call_static(owner, name, *args, **kwargs)
        return function(*args, **kwargs)

    return wrapper


@torch.fx.wrap
def construct(class_name: str, *args: Any, **kwargs: Any) -> Any:
    """`class_name(*args, **kwargs)`: what a traced graph's construction node runs."""
    return _CLASSES[class_name](*args, **kwargs)


@torch.fx.wrap
def call_static(class_name: str, method_name: str, *args: Any, **kwargs: Any) -> Any:
    """`class_name.method_name(*args, **kwargs)`: what a traced graph's node for a static method runs."""
    return getattr(_CLASSES[class_name], method_name)(*args, **kwargs)


def _tracing_proxies(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    if not is_fx_symbolic_tracing():
        return False
    found = []
    torch.fx.node.map_aggregate((args, kwargs), lambda a: found.append(a) if isinstance(a, torch.fx.Proxy) else a)
    return bool(found)
