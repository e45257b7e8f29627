"""A collection's front door: its features taken out of a KeyedJaggedTensor, in its order, and checked.

The float (modules.embedding_modules), quantized (quant.embedding_modules) and sharded
(distributed.sharded_ebc / sharded_ec) collections all take their input here, so they accept and refuse the
same things, with the same errors (each names the collection, the feature and the fix):

- a feature the collection needs is missing from the KJT;
- a batch size per feature (VBE: ``stride_per_key_per_rank``, ``inverse_indices``) where the collection cannot
  take one; the EmbeddingBagCollections (float and sharded) take it: `gather(..., variable_batch=True)` pads
  each feature's bags to the largest stride with empty bags (no ids added, so the lookup and the id
  all-to-alls carry only the deduplicated ids), and `expand_pooled` reads each sample's pooled row through
  the inverse indices, as TorchRec's EmbeddingBagCollection does. The float EmbeddingCollection takes it as
  TorchRec 1.8's unsharded one does: each feature's rows at its own batch size, not expanded (the inverse
  indices are not applied); the sharded and quantized ones refuse it;
- float ids (a pandas id column with a missing value becomes float): refused, never truncated;
- per-id weights: required by a weighted collection, refused by an unweighted one (they would be ignored);
- NaN or inf per-id weights: refused before they reach the tables;
- ids outside their table: `FeatureLayout.check_ids` (rectoolkit.kernels.id_ranges, the one id check; the
  float collection's kernel runs the same check).

`guard_gradient` refuses NaN or inf output gradients before a fused optimizer writes them into the tables.
The two finiteness checks cost a reduction per batch; switch them off with the environment variable
``RECTOOLKIT_CHECK_FINITE=0`` (read at every call) or ``set_finite_checks(False)`` (wins over the variable).

    >>> import torch
    >>> from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor
    >>> layout = FeatureLayout("EmbeddingBagCollection", ["user", "item"], ["t_user", "t_item"], [10, 20])
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(["item", "user"], torch.tensor([7, 8, 1]), torch.tensor([2, 0, 1, 0]))
    >>> gathered = layout.gather(kjt, weighted=False)      # the collection's order: user, then item
    >>> gathered.values.tolist(), gathered.lengths.tolist(), gathered.batch_size
    ([1, 7, 8], [1, 0, 2, 0], 2)
    >>> layout.gather(KeyedJaggedTensor.from_lengths_sync(["user", "item"], torch.tensor([1.0]), torch.tensor([1, 0, 0, 0])),
    ...               weighted=False)
    Traceback (most recent call last):
    ...
    rectoolkit.sparse.validation.IdsError: EmbeddingBagCollection: the ids of the KeyedJaggedTensor are torch.float32; ids must be integers (a float id column usually comes from missing values: drop or fill them, then convert with .long())
"""

from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from rectoolkit.kernels.id_ranges import IdRanges
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor
from rectoolkit.sparse.validation import (IdsError, JaggedAssertionError, MissingFeatureError, check_not_padded,
                                          is_tracing)

FINITE_CHECKS_ENV = "RECTOOLKIT_CHECK_FINITE"
_finite_checks_override: Optional[bool] = None


def set_finite_checks(enabled: Optional[bool]) -> None:
    """Turn the NaN/inf checks of per-id weights and of gradients on or off (None: follow RECTOOLKIT_CHECK_FINITE)."""
    global _finite_checks_override
    _finite_checks_override = enabled


def finite_checks_enabled() -> bool:
    """True unless set_finite_checks(False) or RECTOOLKIT_CHECK_FINITE=0 (also "false", "no", "off"), or while
    torch.export / torch.compile traces (the checks read values; an exported program has no Python to run them)."""
    if is_tracing():
        return False
    if _finite_checks_override is not None:
        return _finite_checks_override
    return os.environ.get(FINITE_CHECKS_ENV, "1").strip().lower() not in {"0", "false", "no", "off"}


def all_finite(tensor: torch.Tensor) -> bool:
    """True when no entry is NaN or inf. One sum first (a NaN or inf entry makes it NaN or inf; about 20x faster
    than isfinite(...).all() on CPU); only a sum that is not finite, which finite entries give when it overflows,
    is checked entry by entry.

    >>> all_finite(torch.tensor([3e38, 3e38])), all_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    """
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


class GatheredFeatures(NamedTuple):
    """A collection's features out of a KJT: values and lengths feature after feature in the collection's order."""

    values: torch.Tensor  # integer ids
    lengths: torch.Tensor  # [F * B]
    weights: Optional[torch.Tensor]  # per-id weights (weighted collections only)
    batch_size: int


class FeatureLayout:
    """The features a collection reads (in table order), the table each one reads, and the checks on a batch."""

    def __init__(self, owner: str, feature_names: Sequence[str], table_names: Sequence[str],
                 rows_per_feature: Sequence[int], hash_allowed: bool = True) -> None:
        self.owner = owner
        self.feature_names: List[str] = list(feature_names)
        self.table_names: List[str] = list(table_names)
        self.id_ranges = IdRanges(rows_per_feature, feature_names, table_names, hash_allowed=hash_allowed)

    def gather(self, features: KeyedJaggedTensor, weighted: bool, variable_batch: bool = False) -> GatheredFeatures:
        """This collection's features out of `features`, checked (see the module docstring).

        With `variable_batch`, a KJT with a batch size per feature comes back with every feature padded to the
        largest one (empty bags); otherwise such a KJT is refused."""
        if features.variable_stride_per_key() or features.inverse_indices_or_none() is not None:
            if not variable_batch:
                raise ValueError(f"{self.owner} does not take a variable batch size per feature "
                                 "(stride_per_key_per_rank / inverse_indices); expand the KeyedJaggedTensor to the "
                                 "full batch, or use an EmbeddingBagCollection")
            if features.variable_stride_per_key():
                features = self._padded_to_largest_stride(features)
        keys, stride = features.keys(), features.stride()
        values, lengths, weights = features.values(), features.lengths(), features.weights_or_none()
        if not is_tracing():  # the sum reads the lengths (on meta: the KJT's stand-in, which adds up)
            check_not_padded(sum(features.length_per_key()), values, self.owner, "forward")
        if list(keys) != self.feature_names:
            position = {k: i for i, k in enumerate(keys)}
            missing = [f for f in self.feature_names if f not in position]
            if missing:
                needed_by = {f: self.table_names[self.feature_names.index(f)] for f in missing}
                raise MissingFeatureError(f"{self.owner}: the KeyedJaggedTensor has no feature(s) {missing} (needed by tables "
                                 f"{needed_by}); it has keys {list(keys)}. Add them (empty lengths are fine).")
            order = [position[f] for f in self.feature_names]
            if is_tracing():  # one gather of static size: slicing by key would need the lengths' values
                take = _positions_in_key_order(lengths.view(len(keys), stride), order, values.shape[0])
                values = values[take]
                weights = weights[take] if weights is not None else None
            else:
                starts = features.offset_per_key()
                values = _cat([values[starts[i]:starts[i + 1]] for i in order], values)
                weights = _cat([weights[starts[i]:starts[i + 1]] for i in order], weights) if weights is not None else None
            lengths = lengths.view(len(keys), stride)[order].reshape(-1)
        self.refuse_float_ids(values)
        if weighted and weights is None:
            raise JaggedAssertionError(f"{self.owner}(is_weighted=True) needs a KeyedJaggedTensor with weights (per-id "
                                       "weights): pass weights= to the KeyedJaggedTensor, or build the collection "
                                       "with is_weighted=False")
        if not weighted and weights is not None:
            fix = ("build the collection with is_weighted=True, or drop the weights" if "Bag" in self.owner else
                   "a sequence collection pools nothing, so no weights apply: drop them")
            raise ValueError(f"{self.owner} is not weighted but the KeyedJaggedTensor has per-id weights, which it "
                             f"would ignore; {fix} (KeyedJaggedTensor(keys, values, lengths=...) without weights=)")
        if weights is not None and finite_checks_enabled() and weights.device.type != "meta":
            self._check_finite_weights(weights, lengths, stride)
        return GatheredFeatures(values, lengths, weights, stride)

    def length_per_feature(self, features: KeyedJaggedTensor) -> List[int]:
        """How many ids each of this collection's features has in `features`, in the collection's order."""
        counts = dict(zip(features.keys(), features.length_per_key()))
        return [counts[f] for f in self.feature_names]

    def _padded_to_largest_stride(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The VBE KJT as a fixed-stride KJT: each key's lengths followed by zeros up to the largest stride."""
        strides = features.stride_per_key()
        largest = max(strides, default=0)
        lengths = features.lengths()
        padded = lengths.new_zeros(len(strides), largest)
        key_of_sample = torch.repeat_interleave(torch.arange(len(strides), device=lengths.device),
                                                torch.tensor(strides, device=lengths.device), output_size=lengths.numel())
        starts = torch.tensor(features.lengths_offset_per_key()[:-1], device=lengths.device)
        padded[key_of_sample, torch.arange(lengths.numel(), device=lengths.device) - starts[key_of_sample]] = lengths
        return KeyedJaggedTensor(keys=features.keys(), values=features.values(), weights=features.weights_or_none(),
                                 lengths=padded.view(-1), stride=largest, length_per_key=features.length_per_key(),
                                 validate=False)

    def inverse_indices(self, features: KeyedJaggedTensor) -> Optional[torch.Tensor]:
        """[features, full batch]: the row of each of this collection's features in `features`' inverse indices
        (TorchRec matches a name ``f@suffix`` to ``f``); None when there are none. A KJT whose features have
        different batch sizes needs them (the pooled rows of each feature are expanded to the full batch)."""
        inverse = features.inverse_indices_or_none()
        if inverse is None:
            strides = dict(zip(features.keys(), features.stride_per_key()))
            mine = [strides[f] for f in self.feature_names if f in strides]
            if any(stride != mine[0] for stride in mine):  # (no set: a traced stride is an unhashable SymInt)
                raise ValueError(f"{self.owner}: the features have different batch sizes {strides} but the "
                                 "KeyedJaggedTensor has no inverse_indices to expand them to one batch; pass "
                                 "inverse_indices=(keys, tensor[len(keys), batch size])")
            return None
        row_of = {key: row for row, key in enumerate(inverse[0])}
        missing = [f for f in self.feature_names if f.split("@")[0] not in row_of]
        if missing:
            raise ValueError(f"{self.owner}: the KeyedJaggedTensor's inverse_indices have no row for feature(s) "
                             f"{missing} (they have keys {list(inverse[0])}); give one row per feature")
        rows = torch.tensor([row_of[f.split("@")[0]] for f in self.feature_names], device=inverse[1].device)
        return inverse[1].index_select(0, rows)

    def refuse_float_ids(self, values: torch.Tensor) -> None:
        if values.is_floating_point():
            raise IdsError(f"{self.owner}: the ids of the KeyedJaggedTensor are {values.dtype}; ids must be integers "
                             "(a float id column usually comes from missing values: drop or fill them, then convert "
                             "with .long())")

    def check_ids(self, gathered: GatheredFeatures, mode: str, subject: str = "") -> torch.Tensor:
        """The gathered ids (int64) checked against their tables, or hashed into them with mode="hash"."""
        self.refuse_float_ids(gathered.values)
        ids = gathered.values.to(torch.int64)
        if mode == "unchecked" or not ids.numel():
            return ids
        ids_per_feature = gathered.lengths.view(len(self.feature_names), -1).sum(1).to(torch.int64)
        return self.id_ranges.check(ids, ids_per_feature, mode, subject, bag_lengths=lambda: gathered.lengths)

    def _check_finite_weights(self, weights: torch.Tensor, lengths: torch.Tensor, stride: int) -> None:
        if all_finite(weights):
            return
        position = int((~torch.isfinite(weights)).nonzero()[0, 0])
        ends = lengths.view(len(self.feature_names), stride).sum(1).cumsum(0).tolist() if stride else []
        feature = next((f for f, end in enumerate(ends) if position < end), 0)
        raise ValueError(
            f"{self.owner}: per-id weight {float(weights[position])} of feature {self.feature_names[feature]!r} "
            f"(value {position} of the batch) is not finite; it would turn rows of table "
            f"{self.table_names[feature]!r} into NaN. Fix the weights (or set {FINITE_CHECKS_ENV}=0 to skip this check).")


def rows_per_feature(names: Sequence[str], rows: torch.Tensor, gathered: GatheredFeatures, need_indices: bool,
                     strides: Optional[Sequence[int]] = None,
                     counts: Optional[Sequence[int]] = None) -> Dict[str, JaggedTensor]:
    """A sequence collection's output: {embedding name: JaggedTensor of the feature's rows [ids, dim]} (with the
    ids as weights when `need_indices`), from the rows of every gathered id. `strides`: each feature's own
    samples when the batch has a batch size per feature (gathered padded to the largest with empty bags).
    `counts`: each feature's ids, where the lengths cannot be read (a meta batch: FeatureLayout.length_per_feature)."""
    per_feature_lengths = gathered.lengths.view(len(names), gathered.batch_size)
    if counts is None:
        counts = per_feature_lengths.sum(1).tolist()
    ids = gathered.values.split(counts)
    if strides is None:
        strides = [gathered.batch_size] * len(names)
    return {name: JaggedTensor(values=chunk, lengths=per_feature_lengths[f, :strides[f]],
                               weights=ids[f] if need_indices else None)
            for f, (name, chunk) in enumerate(zip(names, rows.split(counts)))}


def expand_pooled(pooled: torch.Tensor, inverse_indices: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """[full batch, sum of dims]: sample b's block of feature f is pooled row ``inverse_indices[f, b]``.

    >>> pooled = torch.tensor([[1., 10., 20.], [2., 30., 40.]])     # user (dim 1, 1 sample), item (dim 2, 2)
    >>> expand_pooled(pooled, torch.tensor([[0, 0, 0], [1, 0, 1]]), [1, 2]).tolist()
    [[1.0, 30.0, 40.0], [1.0, 10.0, 20.0], [1.0, 30.0, 40.0]]

    A ranking batch has few distinct rows of inverse indices (the user features share one; the candidate
    features read each sample as it is), so neighbouring features that read alike are moved as one block of
    columns: copied as they are, or their rows selected once; the gradient goes back the same way (an
    `index_add` into the pooled rows). While tracing (torch.export / compile), one elementwise gather.
    """
    inverse_indices = inverse_indices.to(device=pooled.device, dtype=torch.int64)
    full_batch = inverse_indices.shape[1]
    if is_tracing() or not full_batch or not inverse_indices.shape[0]:
        rows = inverse_indices.repeat_interleave(torch.tensor(list(dims), device=pooled.device), dim=0,
                                                 output_size=pooled.shape[1])
        return pooled.gather(0, rows.t())
    return _ExpandColumnRuns.apply(pooled, _column_runs(pooled, inverse_indices, dims), full_batch)


def _column_runs(pooled: torch.Tensor, inverse_indices: torch.Tensor, dims: Sequence[int]) -> list:
    """(first column, end column, rows to read or None for "as they are") of each run of neighbouring features
    that read their pooled rows alike."""
    full_batch = inverse_indices.shape[1]
    rows, kind, as_is = _distinct_reads(inverse_indices)
    as_is = [full_batch <= pooled.shape[0] and same for same in as_is]
    runs: list = []
    column = 0
    for k, dim in zip(kind, dims):
        if runs and runs[-1][2] == k:
            runs[-1][1] += dim
        else:
            runs.append([column, column + dim, k])
        column += dim
    return [(c0, c1, None if as_is[k] else rows[k]) for c0, c1, k in runs]


def _distinct_reads(inverse_indices: torch.Tensor) -> tuple:
    """(distinct rows of the inverse indices, which one each feature reads, whether each reads 0, 1, 2, ...)."""
    rows, kind = torch.unique(inverse_indices, dim=0, return_inverse=True)
    full_batch = inverse_indices.shape[1]
    as_is = [bool(torch.equal(row, torch.arange(full_batch, device=row.device))) for row in rows]
    return rows, kind.tolist(), as_is


def expand_blocks(flat: torch.Tensor, spans: Sequence[Tuple[int, int, int, int]],
                  inverse_indices: Optional[torch.Tensor], width: int,
                  base: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[full batch, width]: `base` (or zeros) plus flat blocks of pooled rows, each expanded with the inverse
    indices straight into its columns (a VBE output_dist's result: no padded intermediate).

    Block k of `flat` is [rows, cols] row-major (the blocks back to back), `spans[k]` = (first output column,
    cols, rows, feature): the pooled rows of `feature` at its own batch size; sample b reads row
    ``inverse_indices[feature, b]`` (None: every block is already at the full batch). Blocks on the same
    columns are summed first (row-wise partial sums), then expanded once; the gradient goes back the same way.

    >>> flat = torch.tensor([1., 2., 10., 20., 30., 40.])  # user: 2 rows x 1 column, item: 2 rows x 2 columns
    >>> expand_blocks(flat, [(0, 1, 2, 0), (1, 2, 2, 1)], torch.tensor([[0, 0, 1], [1, 0, 1]]), 3).tolist()
    [[1.0, 30.0, 40.0], [1.0, 10.0, 20.0], [2.0, 30.0, 40.0]]
    """
    starts_of: dict = {}  # (column, cols, rows, feature) -> starts of its blocks in flat
    start = 0
    for span in spans:
        starts_of.setdefault(tuple(span), []).append(start)
        start += span[1] * span[2]
    if start != flat.numel():
        raise ValueError(f"expand_blocks: the spans cover {start} values but flat has {flat.numel()}")
    if inverse_indices is None:
        full_batch = max((rows for _, _, rows, _ in spans), default=0)
        distinct, read_kind = None, [None] * len(starts_of)
    else:
        inverse_indices = inverse_indices.to(device=flat.device, dtype=torch.int64)
        full_batch = inverse_indices.shape[1]
        distinct, kind, as_is = _distinct_reads(inverse_indices)
        read_kind = [None if as_is[kind[feature]] and rows >= full_batch else kind[feature]
                     for _, _, rows, feature in starts_of]
    targets = [(column, cols, rows, starts, read) for (column, cols, rows, _), starts, read
               in zip(starts_of, starts_of.values(), read_kind)]
    covered = sorted((column, column + cols) for column, cols, _, _, _ in targets)
    disjoint = all(a[1] <= b[0] for a, b in zip(covered, covered[1:]))
    fills = disjoint and sum(end - column for column, end in covered) == width
    runs = [(column, cols, rows, m, step, starts, None if read is None else distinct[read])
            for column, cols, rows, m, step, starts, read in _block_runs(sorted(targets, key=lambda t: t[3]))]
    return _ExpandBlocks.apply(flat, base, runs, full_batch, width, fills)


def _block_runs(targets: list) -> list:
    """Targets (column, cols, rows, starts, read), in flat order, merged into runs (column, cols, rows, m, step,
    starts, read) of m blocks that move as one [m, rows, cols] block: the same cols, rows, read and number of
    source blocks, each source's blocks back to back in flat, and output columns column + j * step (step >= cols:
    a source's features may alternate with another's in the output).

    >>> _block_runs([(0, 2, 3, [0], None), (4, 2, 3, [6], None), (8, 2, 3, [12], None), (2, 2, 1, [18], 0)])
    [(0, 2, 3, 3, 4, [0], None), (2, 2, 1, 1, 2, [18], 0)]
    """
    runs: list = []
    for column, cols, rows, starts, read in targets:
        if runs:
            c0, c, r, m, step, first, k = runs[-1]
            if m == 1:
                step = column - c0
            if (c, r, k, len(first)) == (cols, rows, read, len(starts)) and step >= cols and \
                    column == c0 + m * step and all(start == f + m * rows * cols for start, f in zip(starts, first)):
                runs[-1] = (c0, c, r, m + 1, step, first, k)
                continue
        runs.append((column, cols, rows, 1, cols, list(starts), read))
    return runs


def _run_columns(matrix: torch.Tensor, column: int, cols: int, m: int, step: int) -> torch.Tensor:
    """[rows, m, cols] view of a contiguous matrix's columns column + j * step + [0, cols), j < m."""
    return matrix.as_strided((matrix.shape[0], m, cols), (matrix.shape[1], step, 1), matrix.storage_offset() + column)


class _ExpandBlocks(torch.autograd.Function):
    """Each run of m blocks: summed over its sources, [m, rows, cols] -> the output's [full batch, m x cols]
    columns (rows selected with the inverse indices, or as they are); backward the same way back."""

    @staticmethod
    def forward(ctx, flat, base, runs, full_batch, width, fills):
        ctx.runs, ctx.numel, ctx.has_base = runs, flat.numel(), base is not None
        if base is not None:
            out = base.clone(memory_format=torch.contiguous_format)
        else:
            out = flat.new_empty(full_batch, width) if fills else flat.new_zeros(full_batch, width)
        for column, cols, rows, m, step, starts, read in runs:
            size = m * rows * cols
            piece = flat[starts[0]:starts[0] + size].view(m, rows, cols)
            for start in starts[1:]:
                piece = piece + flat[start:start + size].view(m, rows, cols)
            target = _run_columns(out, column, cols, m, step)
            value = piece.transpose(0, 1)  # [rows, m, cols]
            if read is not None:
                value = value.reshape(rows, m * cols).index_select(0, read).view(full_batch, m, cols)
            else:
                value = value[:full_batch]
            if base is None and fills:
                target.copy_(value)
            else:
                target += value
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        grad_flat = grad.new_empty(ctx.numel)
        B = grad.shape[0]
        for column, cols, rows, m, step, starts, read in ctx.runs:
            columns = _run_columns(grad, column, cols, m, step)  # [B, m, cols]
            if read is None and rows == B:
                piece_grad = columns
            else:
                piece_grad = grad.new_zeros(rows, m, cols)
                if read is None:
                    piece_grad[:B] = columns
                else:
                    piece_grad.view(rows, m * cols).index_add_(0, read, columns.reshape(B, m * cols))
            for start in starts:
                grad_flat[start:start + m * rows * cols].view(m, rows, cols).copy_(piece_grad.transpose(0, 1))
        return grad_flat, (grad if ctx.has_base else None), None, None, None, None


class _ExpandColumnRuns(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pooled, runs, full_batch):
        ctx.runs, ctx.pooled_shape = runs, pooled.shape
        out = pooled.new_empty(full_batch, pooled.shape[1])
        for c0, c1, rows in runs:
            out[:, c0:c1] = pooled[:full_batch, c0:c1] if rows is None else pooled[:, c0:c1].index_select(0, rows)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad_pooled = grad.new_zeros(ctx.pooled_shape)
        for c0, c1, rows in ctx.runs:
            if rows is None:
                grad_pooled[:grad.shape[0], c0:c1] = grad[:, c0:c1]
            else:
                grad_pooled[:, c0:c1].index_add_(0, rows, grad[:, c0:c1].contiguous())
        return grad_pooled, None, None


def guard_gradient(output: torch.Tensor, owner: str) -> torch.Tensor:
    """Make backward raise, before any fused optimizer update, when the gradient of `output` has NaN or inf.

    Returns `output` (a hook is attached when it requires grad and the finiteness checks are on)."""
    if output.requires_grad and finite_checks_enabled():
        def check(grad: torch.Tensor) -> torch.Tensor:
            if not all_finite(grad):
                bad = int((~torch.isfinite(grad)).sum())
                raise ValueError(f"{owner}: the gradient reaching the embeddings has {bad} NaN/inf values; the fused "
                                 "optimizer would write them into the tables, so backward stops here (the tables are "
                                 f"unchanged). Check the loss and the dense layers (or set {FINITE_CHECKS_ENV}=0 to "
                                 "skip this check).")
            return grad

        output.register_hook(check)
    return output


def _positions_in_key_order(lengths_2d: torch.Tensor, order: List[int], num_values) -> torch.Tensor:
    """For each value of the KJT with its keys taken in `order`, its position in the KJT: [num_values] int64.

    >>> _positions_in_key_order(torch.tensor([[2, 1], [0, 1]]), [1, 0], 4).tolist()  # key 0: 3 ids, key 1: 1 id
    [3, 0, 1, 2]
    """
    totals = lengths_2d.sum(1).to(torch.int64)
    starts = torch.cumsum(totals, 0) - totals
    picked = totals[order]
    new_ends = torch.cumsum(picked, 0)
    position = torch.arange(num_values, device=lengths_2d.device)
    new_key = torch.bucketize(position, new_ends, right=True)
    source_starts = starts[order][new_key]
    return source_starts + position - (new_ends - picked)[new_key]


def _cat(parts: List[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    return torch.cat(parts) if parts else like[:0]
