"""Cheap checks that a jagged tensor is well formed, and a switch to turn them off.

Validation is on by default: every constructor checks its inputs with a few whole-tensor reductions
(tens of microseconds at 26 features x 8192 samples) and raises a ValueError naming the key, the sample
and the numbers. In a hot loop where the inputs are known to be good, turn it off:

>>> import torch
>>> from rectoolkit.sparse import JaggedTensor, validation_disabled
>>> with validation_disabled():
...     jt = JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([2]))

or per call with ``validate=False``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable, Iterator, List, Optional, Sequence

import torch

_state = threading.local()

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def validation_enabled() -> bool:
    """True unless inside ``validation_disabled()`` (on this thread)."""
    return getattr(_state, "enabled", True)


def set_validation_enabled(enabled: bool) -> None:
    """Turn construction-time checks on or off for this thread (prefer the context manager)."""
    _state.enabled = bool(enabled)


@contextlib.contextmanager
def validation_disabled() -> Iterator[None]:
    """Skip the construction-time checks of the jagged types inside the ``with`` block."""
    previous = validation_enabled()
    _state.enabled = False
    try:
        yield
    finally:
        _state.enabled = previous


def is_tracing() -> bool:
    """True while torch.compile or torch.export traces: checks that read tensor values are skipped then.

    A traced graph cannot branch on data (it would break the graph, or fail under ``fullgraph=True`` and
    torch.export), and an exported program has no Python left to raise; eager calls keep every check.

    >>> is_tracing()
    False
    """
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def disabled_when_compiled(reason: str) -> Callable[[Callable], Callable]:
    """``torch.compiler.disable(fn, reason=reason)``, made at fn's first call instead of at import.

    torch.compiler.disable imports torch._dynamo, which doubles the time ``import rectoolkit`` takes (about 1.5 s
    more on a 2-core machine), in every launched worker and subprocess, though most never compile. The wrapper
    carries the two attributes by which torch.compile recognizes a disabled function (what torch.compiler.disable
    sets), so a trace does not step into it: a graph break there, and ``fullgraph=True`` raises naming `reason`
    (tests/models/test_compile.py). Run (eagerly), it runs fn through torch.compiler.disable, made at the first call.
    """
    def decorate(fn: Callable) -> Callable:
        made: List[Callable] = []

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not made:
                made.append(torch.compiler.disable(fn, reason=reason))
            return made[0](*args, **kwargs)

        call._torchdynamo_disable = True
        call._torchdynamo_disable_msg = reason
        return call

    return decorate


def should_validate(validate: Optional[bool]) -> bool:
    """Resolve a per-call ``validate`` argument against the global switch (never while tracing, see is_tracing)."""
    if is_tracing():
        return False
    return validation_enabled() if validate is None else validate


def _short_keys(keys: Sequence[str], limit: int = 8) -> str:
    if len(keys) <= limit:
        return repr(list(keys))
    return repr(list(keys[:limit]))[:-1] + f", ... ({len(keys)} keys)]"


class JaggedAssertionError(ValueError, AssertionError):
    """A misuse that TorchRec's jagged types stop with an `assert`: a ValueError here, naming the fix, and an
    AssertionError too, so that code written against TorchRec (`except AssertionError`) catches it."""


class JaggedIndexError(ValueError, IndexError):
    """As JaggedAssertionError, where TorchRec raises an IndexError (a key position out of range)."""


class MissingFeatureError(ValueError, KeyError):
    """A key that is not there (`kjt["z"]`, a feature a collection needs): TorchRec fails with KeyError(key); this
    is a KeyError too (printed as its message, not quoted), and a ValueError naming the keys there and the fix."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class IdsError(ValueError, RuntimeError, IndexError):
    """Ids a table cannot look up (float ids, ids out of range): TorchRec's lookups fail with a RuntimeError
    (embedding_bag) or an IndexError (embedding); this is both, and a ValueError naming the feature and table."""


def check_integer(tensor: Optional[torch.Tensor], name: str, owner: str) -> None:
    if tensor is None:
        return
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.numel() > 0 and tensor.dtype not in _INTEGER_DTYPES:
        raise JaggedAssertionError(f"{owner}: {name} must have an integer dtype, got {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{owner}: {name} must be 1-D, got shape {tuple(tensor.shape)}")


def key_major_1d(
    lengths: Optional[torch.Tensor], offsets: Optional[torch.Tensor], owner: str, check: bool
) -> "tuple[Optional[torch.Tensor], Optional[torch.Tensor]]":
    """TorchRec's KJT also takes lengths as a [keys, stride] tensor and offsets as [keys, stride + 1] (each row
    starting where the one before ends), and reads them key-major, as its flatten_lengths(): the same 1-D ones.

    >>> key_major_1d(torch.tensor([[1, 1], [2, 0]]), torch.tensor([[0, 1, 2], [2, 4, 4]]), "KJT", True)
    (tensor([1, 1, 2, 0]), tensor([0, 1, 2, 4, 4]))
    """
    if isinstance(lengths, torch.Tensor) and lengths.dim() == 2:
        lengths = lengths.reshape(-1)
    if isinstance(offsets, torch.Tensor) and offsets.dim() == 2:
        if offsets.numel() == 0:
            return lengths, offsets.reshape(-1)
        if check and offsets.size(0) > 1 and not torch.equal(offsets[1:, 0], offsets[:-1, -1]):
            row = int(torch.nonzero(offsets[1:, 0] != offsets[:-1, -1])[0, 0]) + 1
            raise ValueError(
                f"{owner}: 2-D offsets row {row} starts at {int(offsets[row, 0])} but row {row - 1} ends at "
                f"{int(offsets[row - 1, -1])}; each row (one key) must start where the one before ends, or pass "
                "1-D offsets"
            )
        offsets = torch.cat([offsets[:, :-1].reshape(-1), offsets[-1:, -1]])
    return lengths, offsets


def check_weights(values: torch.Tensor, weights: Optional[torch.Tensor], owner: str) -> None:
    if weights is None:
        return
    if weights.size(0) != values.size(0):
        raise ValueError(
            f"{owner}: weights has {weights.size(0)} entries but values has {values.size(0)}; "
            "pass one weight per value"
        )


def describe_position(position: int, keys: Optional[Sequence[str]], stride: int) -> str:
    """'key 'user', sample 3' for a flat index into a KJT's lengths; 'sample 3' for a JaggedTensor."""
    if keys is None or stride <= 0:
        return f"sample {position}"
    return f"key {keys[position // stride]!r}, sample {position % stride}"


def check_lengths_nonnegative(
    lengths: torch.Tensor,
    min_length: int,
    owner: str,
    keys: Optional[Sequence[str]] = None,
    stride: int = 0,
) -> None:
    if min_length >= 0:
        return
    position = int(torch.nonzero(lengths < 0)[0, 0])
    raise ValueError(
        f"{owner}: lengths must be >= 0 but {describe_position(position, keys, stride)} has length "
        f"{int(lengths[position])}"
    )


def check_total_length(total: int, values: torch.Tensor, owner: str, detail: str = "") -> None:
    """Lengths may cover fewer values than there are (a padded batch, as TorchRec accepts: the tail is unused),
    never more."""
    if total > values.size(0):
        raise ValueError(
            f"{owner}: lengths sum to {total} but values has only {values.size(0)} entries{detail}; "
            "lengths[i] must count the values of sample i"
        )


def check_not_padded(total: int, values: torch.Tensor, owner: str, operation: str) -> None:
    """Refuse a padded batch (values longer than its lengths' sum) where an operation needs every value counted."""
    if total != values.size(0):
        raise ValueError(
            f"{owner}.{operation}: lengths sum to {total} but values has {values.size(0)} entries (a padded batch); "
            f"{operation} needs exactly the counted values (TorchRec fails here too): drop the padding first, "
            f"values[:{total}] (and weights[:{total}])"
        )


def check_offsets(
    offsets: torch.Tensor,
    values: torch.Tensor,
    owner: str,
    keys: Optional[Sequence[str]] = None,
    stride: int = 0,
) -> torch.Tensor:
    """Offsets start at 0, never decrease and end at len(values). Returns the lengths (their diff)."""
    if offsets.numel() == 0:
        if values.size(0) != 0:
            raise ValueError(f"{owner}: offsets is empty but values has {values.size(0)} entries")
        return offsets
    first, last = offsets[[0, -1]].tolist()
    if first != 0:
        raise ValueError(f"{owner}: offsets must start at 0, got offsets[0] = {first}")
    lengths = torch.diff(offsets)
    if lengths.numel() > 0:
        smallest = int(lengths.min())
        if smallest < 0:
            position = int(torch.nonzero(lengths < 0)[0, 0])
            raise ValueError(
                f"{owner}: offsets must not decrease but offsets[{position + 1}] = "
                f"{int(offsets[position + 1])} < offsets[{position}] = {int(offsets[position])} "
                f"({describe_position(position, keys, stride)})"
            )
    if last != values.size(0):
        raise ValueError(
            f"{owner}: offsets end at {last} but values has {values.size(0)} entries; "
            "the last offset must equal len(values)"
        )
    return lengths


def check_keys_and_stride(
    keys: List[str], num_lengths: int, stride: Optional[int], owner: str
) -> int:
    """The lengths tensor holds len(keys) * stride entries; returns the stride."""
    num_keys = len(keys)
    if num_keys == 0:
        if num_lengths != 0:
            raise ValueError(f"{owner}: no keys but lengths has {num_lengths} entries")
        return stride or 0
    if stride is None:
        if num_lengths % num_keys != 0:
            raise ValueError(
                f"{owner}: lengths has {num_lengths} entries, not a multiple of the "
                f"{num_keys} keys {_short_keys(keys)}; lengths must hold len(keys) * stride entries"
            )
        return num_lengths // num_keys
    if num_lengths != num_keys * stride:
        raise ValueError(
            f"{owner}: lengths has {num_lengths} entries but len(keys) * stride = {num_keys} * {stride}"
            f" = {num_keys * stride} (keys={_short_keys(keys)})"
        )
    return stride


def unknown_key_error(key: object, keys: Sequence[str], owner: str) -> KeyError:
    return MissingFeatureError(f"{owner}: unknown key {key!r}; the keys are {_short_keys(keys, 30)}")
