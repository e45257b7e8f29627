"""JaggedTensor: one sparse feature over a batch, a values tensor cut into samples by lengths.

    values  = [5, 7, 1]          the ids of all samples, back to back
    lengths = [1, 2]             sample 0 has 1 id, sample 1 has 2
    offsets = [0, 1, 3]          where each sample starts (and the end)

Same constructor arguments, methods, results and printed layout as ``torchrec.JaggedTensor``.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from rectoolkit.sparse import pytree_nodes, validation
from rectoolkit.sparse.fx_construct import traced_construction
from rectoolkit.sparse.jagged_ops import (
    jagged_to_padded_dense,
    jagged_values_string,
    lengths_to_offsets,
    min_and_sum_per_row,
    offsets_to_lengths,
)

_OWNER = "JaggedTensor"


@traced_construction
class JaggedTensor:
    """An optionally weighted jagged tensor: ``values`` split into samples by ``lengths`` or ``offsets``.

    Args:
        values: all values of all samples, concatenated ([N] or [N, D]).
        weights: one weight per value (same first dimension as values), or None.
        lengths: number of values of each sample ([B]).
        offsets: start of each sample in values, plus the end ([B + 1], starting at 0).
        validate: check the inputs (default: on, unless inside ``validation_disabled()``).

    >>> jt = JaggedTensor(values=torch.tensor([5, 7, 1]), lengths=torch.tensor([1, 2]))
    >>> jt.offsets()
    tensor([0, 1, 3])
    >>> jt.to_dense()
    [tensor([5]), tensor([7, 1])]
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        lengths: Optional[torch.Tensor] = None,
        offsets: Optional[torch.Tensor] = None,
        *,
        validate: Optional[bool] = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise validation.JaggedAssertionError(f"{_OWNER}: pass lengths or offsets (or both)")
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        if validation.should_validate(validate) and values.device.type != "meta":  # meta: no data to check
            self._validate()

    def _validate(self) -> None:
        values, lengths, offsets = self._values, self._lengths, self._offsets
        validation.check_integer(lengths, "lengths", _OWNER)
        validation.check_integer(offsets, "offsets", _OWNER)
        validation.check_weights(values, self._weights, _OWNER)
        if offsets is not None:
            offset_lengths = validation.check_offsets(offsets, values, _OWNER)
            if lengths is not None and offsets.numel() > 0:
                if lengths.numel() != offsets.numel() - 1 or not torch.equal(
                    lengths.to(offset_lengths.dtype), offset_lengths
                ):
                    raise ValueError(
                        f"{_OWNER}: lengths {lengths.tolist()[:10]} do not match offsets "
                        f"{offsets.tolist()[:11]}; pass one of them, or lengths = diff(offsets)"
                    )
            return
        assert lengths is not None
        if lengths.numel() == 0:
            validation.check_total_length(0, values, _OWNER)
            return
        total, smallest = min_and_sum_per_row(lengths.view(1, -1), torch.int64)
        validation.check_lengths_nonnegative(lengths, smallest, _OWNER)
        validation.check_total_length(total, values, _OWNER)

    # ----------------------------------------------------------------------------------- builders
    @staticmethod
    def empty(
        is_weighted: bool = False,
        device: Optional[torch.device] = None,
        values_dtype: Optional[torch.dtype] = None,
        weights_dtype: Optional[torch.dtype] = None,
        lengths_dtype: torch.dtype = torch.int32,
    ) -> "JaggedTensor":
        """A JaggedTensor with no samples and no values."""
        return JaggedTensor(
            values=torch.empty(0, dtype=values_dtype, device=device),
            weights=torch.empty(0, dtype=weights_dtype, device=device) if is_weighted else None,
            lengths=torch.empty(0, dtype=lengths_dtype, device=device),
            offsets=torch.empty(0, dtype=lengths_dtype, device=device),
            validate=False,
        )

    @staticmethod
    def empty_like(jt: "JaggedTensor", device: Optional[torch.device] = None) -> "JaggedTensor":
        """No samples, the same dtypes and device (device=None); or the same shapes, uninitialized, on ``device``.

        >>> JaggedTensor.empty_like(JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([2]))).lengths()
        tensor([], dtype=torch.int64)
        """
        if device is None:
            weights = jt.weights_or_none()
            return JaggedTensor(values=jt.values().new_empty(0),
                                weights=weights.new_empty(0) if weights is not None else None,
                                lengths=jt.lengths().new_empty(0), validate=False)

        def like(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return torch.empty_like(tensor, device=device) if tensor is not None else None

        return JaggedTensor(values=like(jt.values()), weights=like(jt.weights_or_none()),
                            lengths=like(jt.lengths_or_none()), offsets=like(jt.offsets_or_none()), validate=False)

    def copy_(self, jt: "JaggedTensor", non_blocking: bool = False) -> "JaggedTensor":
        """Copy ``jt``'s values, and its weights, lengths and offsets where both hold them, into this one's tensors
        in place (the shapes must already match, as for torch.Tensor.copy_); returns self."""
        for mine, theirs in ((self._values, jt._values), (self._weights, jt._weights),
                             (self._lengths, jt._lengths), (self._offsets, jt._offsets)):
            if mine is not None and theirs is not None:
                mine.copy_(theirs, non_blocking=non_blocking)
        return self

    @staticmethod
    def from_dense_lengths(
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
    ) -> "JaggedTensor":
        """From a padded [B, N] tensor: keep the first lengths[i] entries of row i.

        >>> JaggedTensor.from_dense_lengths(torch.tensor([[1, 2], [3, 0]]), torch.tensor([2, 1])).values()
        tensor([1, 2, 3])
        """
        positions = torch.arange(values.size(1), device=values.device)
        mask = positions.unsqueeze(0) < lengths.unsqueeze(-1)
        return JaggedTensor(
            values=values[mask],
            weights=weights[mask] if weights is not None else None,
            lengths=lengths,
        )

    @staticmethod
    def from_dense(
        values: List[torch.Tensor],
        weights: Optional[List[torch.Tensor]] = None,
    ) -> "JaggedTensor":
        """From one tensor per sample; lengths are int32.

        >>> JaggedTensor.from_dense([torch.tensor([1.0]), torch.tensor([]), torch.tensor([7.0, 8.0])]).lengths()
        tensor([1, 0, 2], dtype=torch.int32)
        """
        values_tensor = torch.cat(values, dim=0)
        lengths = torch.tensor(
            [value.size(0) for value in values], dtype=torch.int32, device=values_tensor.device
        )
        weights_tensor = torch.cat(weights, dim=0) if weights is not None else None
        return JaggedTensor(values=values_tensor, weights=weights_tensor, lengths=lengths)

    # ---------------------------------------------------------------------------------- accessors
    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise validation.JaggedAssertionError("This (Keyed)JaggedTensor doesn't have weights.")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        """Values per sample; computed from offsets (and cached) if only offsets were given."""
        if self._lengths is None:
            self._lengths = offsets_to_lengths(self._offsets)
        return self._lengths

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """Start of each sample plus the end; computed from lengths (and cached) if needed."""
        if self._offsets is None:
            self._offsets = lengths_to_offsets(self._lengths)
        return self._offsets

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        return self._offsets

    def device(self) -> torch.device:
        return self._values.device

    def size_in_bytes(self) -> int:
        tensors = [self._values, self._weights, self._lengths, self._offsets]
        return sum(t.element_size() * t.numel() for t in tensors if t is not None)

    # -------------------------------------------------------------------------------- conversions
    def to_dense(self) -> List[torch.Tensor]:
        """One tensor (a view into values) per sample; the padding of a padded batch is left out."""
        lengths = self.lengths().tolist()
        return list(torch.split(self._values[:sum(lengths)], lengths))

    def to_dense_weights(self) -> Optional[List[torch.Tensor]]:
        """One weights tensor per sample, or None if unweighted."""
        if self._weights is None:
            return None
        lengths = self.lengths().tolist()
        return list(torch.split(self._weights[:sum(lengths)], lengths))

    def _padded(self, source: torch.Tensor, desired_length: Optional[int], padding_value: float,
                pad_from_beginning: bool = False, chop_from_beginning: bool = False) -> torch.Tensor:
        lengths = self.lengths()
        if desired_length is None:
            desired_length = int(lengths.max()) if lengths.numel() > 0 else 0
        if not pad_from_beginning and not chop_from_beginning:  # (TorchRec 1.8's only way)
            return jagged_to_padded_dense(source, self.offsets(), lengths, desired_length, padding_value)
        lengths = lengths.to(torch.long)
        kept = lengths.clamp(max=desired_length)  # values of each row that show
        first = self.offsets()[:-1].to(torch.long) + (lengths - kept if chop_from_beginning else 0)
        column0 = desired_length - kept if pad_from_beginning else torch.zeros_like(kept)  # where they start
        columns = torch.arange(desired_length, device=source.device)
        inside = (columns >= column0[:, None]) & (columns < (column0 + kept)[:, None])
        shape = (lengths.numel(), desired_length, *source.shape[1:])
        if source.shape[0] == 0:
            return torch.full(shape, padding_value, dtype=source.dtype, device=source.device)
        index = (first[:, None] + columns - column0[:, None]).clamp(0, source.shape[0] - 1)
        taken = source[index]
        inside = inside.view(*inside.shape, *([1] * (source.dim() - 1)))
        return torch.where(inside, taken, torch.full_like(taken, padding_value))

    def to_padded_dense(self, desired_length: Optional[int] = None, padding_value: float = 0.0,
                        pad_from_beginning: bool = False, chop_from_beginning: bool = False) -> torch.Tensor:
        """A [B, N] tensor, N = desired_length or the longest sample; short rows padded, long rows cut.

        As TorchRec 1.8's by default: values from the left, padding after them, long rows keep their first N values.
        `pad_from_beginning` / `chop_from_beginning` (later TorchRec's options, whose defaults are True there): the
        padding goes before the values / long rows keep their last N values.

        >>> jt = JaggedTensor(values=torch.tensor([1., 2., 3.]), lengths=torch.tensor([2, 0, 1]))
        >>> jt.to_padded_dense(desired_length=1, padding_value=9.0)
        tensor([[1.],
                [9.],
                [3.]])
        >>> jt.to_padded_dense(desired_length=3, pad_from_beginning=True)
        tensor([[0., 1., 2.],
                [0., 0., 0.],
                [0., 0., 3.]])
        >>> jt.to_padded_dense(desired_length=1, chop_from_beginning=True)
        tensor([[2.],
                [0.],
                [3.]])
        """
        return self._padded(self._values, desired_length, padding_value, pad_from_beginning, chop_from_beginning)

    def to_padded_dense_weights(self, desired_length: Optional[int] = None, padding_value: float = 0.0,
                                pad_from_beginning: bool = False,
                                chop_from_beginning: bool = False) -> Optional[torch.Tensor]:
        """Like to_padded_dense, for the weights; None if unweighted."""
        if self._weights is None:
            return None
        return self._padded(self._weights, desired_length, padding_value, pad_from_beginning, chop_from_beginning)

    def to(self, device: torch.device, non_blocking: bool = False) -> "JaggedTensor":
        def move(tensor: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return tensor.to(device, non_blocking=non_blocking) if tensor is not None else None

        return JaggedTensor(
            values=move(self._values),
            weights=move(self._weights),
            lengths=move(self._lengths),
            offsets=move(self._offsets),
            validate=False,
        )

    def record_stream(self, stream: "torch.cuda.Stream") -> None:
        for tensor in (self._values, self._weights, self._lengths, self._offsets):
            if tensor is not None:
                tensor.record_stream(stream)

    def __str__(self) -> str:
        offsets = self.offsets().tolist()
        samples = len(offsets) - 1
        if self._weights is None:
            return "JaggedTensor({\n    " + jagged_values_string(self._values, offsets, 0, samples) + "\n})\n"
        return (
            "JaggedTensor({\n"
            + '    "values": '
            + jagged_values_string(self._values, offsets, 0, samples)
            + ',\n    "weights": '
            + jagged_values_string(self._weights, offsets, 0, samples)
            + "\n})\n"
        )


def __getattr__(name: str):
    """TorchRec's module path: torchrec.sparse.jagged_tensor holds all three jagged types and their equality checks,
    so `rectoolkit.sparse.jagged_tensor.KeyedJaggedTensor` works as well (imported lazily: they build on this
    module)."""
    if name == "KeyedJaggedTensor":
        from rectoolkit.sparse.keyed_jagged_tensor import KeyedJaggedTensor

        return KeyedJaggedTensor
    if name == "KeyedTensor":
        from rectoolkit.sparse.keyed_tensor import KeyedTensor

        return KeyedTensor
    if name in ("jt_is_equal", "kjt_is_equal"):
        from rectoolkit.sparse import equality

        return getattr(equality, name)
    if name in ("ComputeKJTToJTDict", "ComputeJTDictToKJT", "regroup_kts", "permute_multi_embedding",
                "flatten_kjt_list", "unflatten_kjt_list"):
        from rectoolkit.sparse import conversions

        return getattr(conversions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# A pytree node as in TorchRec (pytree_nodes.py): the fields are the leaves, no context.
_FIELDS = ["_values", "_weights", "_lengths", "_offsets"]


def _jt_flatten(jt: JaggedTensor) -> Tuple[List[Optional[torch.Tensor]], None]:
    return [getattr(jt, name) for name in _FIELDS], None


def _jt_unflatten(leaves: List[Optional[torch.Tensor]], context: None) -> JaggedTensor:
    return JaggedTensor(*leaves, validate=False)  # leaves of a traced program: nothing to check them with


pytree_nodes.register_node(JaggedTensor, _FIELDS, _jt_flatten, _jt_unflatten)
JaggedTensor._fields = _FIELDS  # TorchRec's name for the pytree leaves
