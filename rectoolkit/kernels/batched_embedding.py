"""Batched embedding lookup: every table of a collection looked up in one call, optimizer fused into backward.

This is the entry point for anything that looks up embeddings from plain tensors (the collections in
rectoolkit.modules, and the sharded modules, whose local shards are just smaller tables):

    >>> tables = [TableSpec(num_embeddings=10, embedding_dim=4), TableSpec(num_embeddings=6, embedding_dim=4)]
    >>> kernel = make_batched_embedding(tables, feature_table_map=[0, 1, 1], pooling="sum",
    ...                                 optimizer=FusedOptimizerConfig("row_wise_adagrad", lr=0.1))
    >>> indices = torch.tensor([1, 2, 3,   5, 0,   4])  # ids of feature 0, then 1, then 2 (local to each table)
    >>> offsets = torch.tensor([0, 2, 3,   4, 5,   5, 6])  # (feature, bag) major: F * B + 1 entries, B = 2
    >>> out = kernel(indices, offsets)  # [B, sum of the features' dims] = [2, 12]
    >>> out.shape
    torch.Size([2, 12])
    >>> out.sum().backward()  # updates the touched rows in place; no .grad is materialized

Sharded modules use the same entry point: a local shard of rows [r0, r1) and columns [c0, c1) of a table is
just `TableSpec(r1 - r0, c1 - c0, name)`, and the ids passed in must already be local (id - r0). Row-wise
Adagrad then averages g*g over the shard's columns only (as TorchRec's column-wise sharding does).

Inputs follow fbgemm's TBE layout: `indices` are the ids of feature 0 for bags 0..B-1, then of feature 1, and
so on (a KeyedJaggedTensor's values in key order); `offsets` has F * B + 1 entries; feature f reads table
`feature_table_map[f]`. With pooling "sum" the output is [B, sum_f dim(f)] in feature order (MEAN is a
per-bag scaling the caller applies); with pooling "none" it is [len(indices), dim] (one row per id, all
tables of one dim).

Variable batch (VBE, as fbgemm's `batch_size_per_feature_per_rank` with one rank): pass
`batch_size_per_feature=[B_0, B_1, ...]` and feature f has B_f bags of its own (`offsets` has sum(B_f) + 1
entries, feature after feature); the output is then one flat buffer, feature after feature, each feature's
block [B_f, dim(f)] row-major, and its gradient comes back the same way (the fused update included):

    >>> vbe = make_batched_embedding(tables, feature_table_map=[0, 1, 1], optimizer=FusedOptimizerConfig("sgd", lr=0.1))
    >>> flat = vbe(torch.tensor([1, 2, 3, 5]), torch.tensor([0, 2, 3, 4, 4]), batch_size_per_feature=[1, 2, 1])
    >>> flat.shape  # 1 x 4 + 2 x 4 + 1 x 4
    torch.Size([16])

Ids are checked against each table's range before any kernel runs (`ids_out_of_range="error"`), or mapped
into range with a modulo (`"hash"`), or passed unchecked (`"unchecked"`, fastest; out-of-range ids are then
undefined behaviour in fbgemm).

Backends: "fbgemm" runs fbgemm_gpu's SplitTableBatchedEmbeddingBagsCodegen (CPU or CUDA) with the optimizer
fused; "torch" runs one `embedding_bag` per embedding dim over the concatenated tables (shifted ids) and a
custom autograd function whose backward sums the gradients of duplicate ids and updates the touched rows
(fbgemm's rules, see fused_optimizers.py). "auto" picks fbgemm when `fbgemm_available()` and it supports the
case (fbgemm's CPU kernels have no Adam), torch otherwise. Without a fused optimizer (`optimizer=None`) the
torch kernel gives ordinary dense `.grad` on `kernel.table_weights` (for inspection, or any torch optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from rectoolkit.kernels.backend import fbgemm_available
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig, apply_row_update, init_optimizer_state
from rectoolkit.kernels.id_ranges import ID_MODES, IdRanges, per_id
from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.kernels.segments import pad_bags, segment_positions, take_segments  # noqa: F401 (their old path)
from rectoolkit.kernels.traced_lookup import traced_lookup
from rectoolkit.sparse.validation import IdsError, disabled_when_compiled, is_tracing

BACKENDS = ("auto", "torch", "fbgemm")


@dataclass(frozen=True)
class TableSpec:
    """Shape of one table (or one local shard of a table) in a batched kernel."""

    num_embeddings: int
    embedding_dim: int
    name: str = ""


def choose_backend(
    backend: str, optimizer: Optional[FusedOptimizerConfig], device: torch.device, dtype: torch.dtype = torch.float32,
    tables: Sequence[TableSpec] = (), feature_table_map: Optional[Sequence[int]] = None,
) -> str:
    """Resolve "auto" | "torch" | "fbgemm" to the backend that will run, raising if fbgemm is forced but cannot.

    fbgemm runs only where it gives the same numbers as the reference rules: fp32, dims multiple of 4, and
    every table read by a feature. Any feature order is fine (the fbgemm kernel groups a table's features).
    """
    feature_table_map = list(range(len(tables))) if feature_table_map is None else list(feature_table_map)
    embedding_dims = [t.embedding_dim for t in tables]
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}; use one of {BACKENDS}")
    if backend == "torch" or optimizer is None or device.type == "meta":
        return "torch"  # dense gradients and meta tensors always run the torch kernel
    why_not = None
    if not fbgemm_available():
        why_not = "fbgemm_gpu is not importable (or RECTOOLKIT_DISABLE_FBGEMM=1 is set)"
    elif optimizer.optimizer == EmbOptimType.ADAM and device.type == "cpu":
        why_not = "fbgemm's CPU kernels have no fused Adam"
    elif dtype != torch.float32:
        why_not = f"the fbgemm path here stores fp32 weights only (got {dtype})"
    elif any(d % 4 for d in embedding_dims):
        why_not = f"fbgemm needs embedding dims that are multiples of 4 (got {sorted(set(embedding_dims))})"
    elif len(set(feature_table_map)) != len(tables):
        why_not = "fbgemm needs every table to be read by at least one feature"
    elif device.type not in ("cpu", "cuda"):
        why_not = f"fbgemm runs on cpu or cuda, not {device.type}"
    if why_not is None:
        return "fbgemm"
    if backend == "fbgemm":
        raise ValueError(f"backend='fbgemm' requested but {why_not}; use backend='torch' or 'auto'")
    return "torch"


class BatchedEmbeddingKernel:
    """Common part of both backends: table layout, id checks, per-table weight parameters, optimizer state.

    `table_weights[t]` is an nn.Parameter of shape [rows_t, dim_t] that is a view into the kernel's storage, so
    reading or writing it reads or writes what the kernel looks up. Build kernels with make_batched_embedding().
    """

    backend = "base"

    def __init__(
        self,
        tables: Sequence[TableSpec],
        feature_table_map: Optional[Sequence[int]] = None,
        pooling: str = "sum",
        optimizer: Optional[FusedOptimizerConfig] = None,
        device: Union[str, torch.device, None] = None,
        dtype: torch.dtype = torch.float32,
        ids_out_of_range: str = "error",
        feature_names: Optional[Sequence[str]] = None,
    ) -> None:
        self.tables = list(tables)
        if not self.tables:
            raise ValueError("a batched embedding kernel needs at least one table")
        self.feature_table_map = list(range(len(self.tables))) if feature_table_map is None else list(feature_table_map)
        for f, t in enumerate(self.feature_table_map):
            if not 0 <= t < len(self.tables):
                raise ValueError(f"feature_table_map[{f}] = {t} is not a table index (there are {len(self.tables)} tables)")
        if pooling not in ("sum", "none"):
            raise ValueError(f"kernel pooling must be 'sum' or 'none' (MEAN is applied by the caller), got {pooling!r}")
        if ids_out_of_range not in ID_MODES:
            raise ValueError(f"ids_out_of_range must be one of {ID_MODES}, got {ids_out_of_range!r}")
        self.pooled = pooling == "sum"
        if not self.pooled and len({t.embedding_dim for t in self.tables}) > 1:
            raise ValueError(
                f"pooling 'none' needs one embedding dim for all tables, got {sorted({t.embedding_dim for t in self.tables})}; "
                "build one kernel per dim"
            )
        self.optimizer = optimizer
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self.ids_out_of_range = ids_out_of_range
        self.feature_names = list(feature_names) if feature_names else [f"feature_{f}" for f in range(len(self.feature_table_map))]
        self.num_features = len(self.feature_table_map)
        self.feature_dims = [self.tables[t].embedding_dim for t in self.feature_table_map]
        self.table_weights: List[torch.nn.Parameter] = []
        self.id_ranges = IdRanges([self.tables[t].num_embeddings for t in self.feature_table_map], self.feature_names,
                                  [self.tables[t].name or str(t) for t in self.feature_table_map], self.device)
        self.num_updates = 0  # backward passes that updated weights (Adam's step count)

    # ---------------------------------------------------------------- inputs
    def prepare_ids(self, indices: torch.Tensor, offsets: torch.Tensor,
                    batch_size_per_feature: Optional[Sequence[int]] = None) -> tuple:
        """Validate the layout, check or hash ids; return (int64 ids, int64 offsets, batch size, ids per feature).

        With `batch_size_per_feature` (VBE) the batch size returned is None."""
        if indices.dim() != 1 or offsets.dim() != 1:
            raise ValueError(f"indices and offsets must be 1-D, got shapes {tuple(indices.shape)} and {tuple(offsets.shape)}")
        if indices.is_floating_point():
            raise IdsError(f"ids must be integers, got dtype {indices.dtype}")
        ids = indices.to(device=self.device, dtype=torch.int64)
        offsets = offsets.to(device=self.device, dtype=torch.int64)
        num_bags = offsets.numel() - 1
        if batch_size_per_feature is not None:
            bag_starts = self._vbe_bag_starts(batch_size_per_feature, num_bags)
            batch_size = None
        elif num_bags < 0 or num_bags % self.num_features:
            raise ValueError(
                f"offsets has {offsets.numel()} entries; expected num_features * batch_size + 1 "
                f"with num_features={self.num_features} ({self.feature_names})"
            )
        else:
            batch_size = num_bags // self.num_features
        if self.device.type == "cpu" and not is_tracing() and int(offsets[-1]) != ids.numel():
            raise ValueError(f"offsets end at {int(offsets[-1])} but there are {ids.numel()} ids: a padded batch "
                             "(values longer than its lengths count) cannot be looked up (TorchRec's collections fail "
                             f"on it too); drop the padding, values[:{int(offsets[-1])}], before the lookup")
        if batch_size is None:
            ids_per_feature = offsets[torch.tensor(bag_starts, device=self.device)].diff()
        elif is_tracing():  # no branch on the (symbolic) batch size; a batch of 1 or 0 is like any other
            ids_per_feature = offsets.diff().view(self.num_features, batch_size).sum(1)
        elif batch_size:
            ids_per_feature = offsets[::batch_size].diff()
        else:
            ids_per_feature = torch.zeros(self.num_features, dtype=torch.int64, device=self.device)
        ids = self.id_ranges.check(ids, ids_per_feature, self.ids_out_of_range, bag_lengths=offsets.diff)
        return ids, offsets, batch_size, ids_per_feature

    def _vbe_bag_starts(self, batch_size_per_feature: Sequence[int], num_bags: int) -> List[int]:
        """The first bag of every feature (and the end), checking a VBE call's batch sizes against `offsets`."""
        sizes = [int(b) for b in batch_size_per_feature]
        if not self.pooled:
            raise ValueError("batch_size_per_feature needs pooling 'sum': a sequence lookup has no bags")
        if is_tracing():
            raise NotImplementedError("batch_size_per_feature (VBE) cannot be traced (torch.export / compile); "
                                      "expand the batch to one batch size first")
        if len(sizes) != self.num_features or any(b < 0 for b in sizes):
            raise ValueError(f"batch_size_per_feature={sizes} must give {self.num_features} batch sizes >= 0, one per "
                             f"feature ({self.feature_names})")
        if sum(sizes) != num_bags:
            raise ValueError(f"offsets has {num_bags + 1} entries but batch_size_per_feature={sizes} has {sum(sizes)} "
                             f"bags; offsets needs sum(batch_size_per_feature) + 1 entries")
        starts = [0]
        for b in sizes:
            starts.append(starts[-1] + b)
        return starts

    per_id = staticmethod(per_id)

    # ---------------------------------------------------------------- weights and state
    def split_embedding_weights(self) -> List[torch.Tensor]:
        """Per-table views [rows, dim] of the storage (fresh views; table_weights are the Parameters)."""
        raise NotImplementedError

    def split_optimizer_states(self) -> List[Dict[str, torch.Tensor]]:
        """Per-table optimizer state ({"momentum1": ..., ...}), views into the kernel's state."""
        raise NotImplementedError

    def set_learning_rate(self, lr: float) -> None:
        if self.optimizer is None:
            raise ValueError("this kernel has no fused optimizer (dense gradients); set the lr of your torch optimizer")
        self.optimizer.lr = float(lr)

    def get_learning_rate(self) -> float:
        return self.optimizer.lr if self.optimizer is not None else float("nan")

    def sync_parameters(self) -> None:
        """Re-attach table_weights to the storage after something replaced their data (deepcopy, assign-load).

        The Parameter's current values win: they are copied into the storage, then the Parameter views it again.
        Cheap when nothing changed (compares data pointers with the ones seen last time). Skipped while tracing:
        the traced lookup reads the Parameters themselves (see traced_lookup.py).
        """
        if is_tracing():
            return
        if getattr(self, "_synced_ptrs", None) == [p.data_ptr() for p in self.table_weights]:
            return
        with torch.no_grad():
            for param, view in zip(self.table_weights, self.split_embedding_weights()):
                if param.device != view.device:
                    raise ValueError(
                        f"table weight on {param.device} but the kernel's storage is on {view.device}; "
                        "rebuild the kernel on the new device (the collections do this for you)"
                    )
                if param.data_ptr() != view.data_ptr() or param.shape != view.shape:
                    view.copy_(param.detach())
                    param.data = view
        self._synced_ptrs = [p.data_ptr() for p in self.table_weights]

    def adopt_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Make existing Parameters (e.g. a collection's, or another kernel's) the views of this kernel's storage."""
        if len(params) != len(self.tables):
            raise ValueError(f"expected {len(self.tables)} parameters, got {len(params)}")
        with torch.no_grad():
            for t, (param, view) in enumerate(zip(params, self.split_embedding_weights())):
                if tuple(param.shape) != tuple(view.shape):
                    raise ValueError(f"table {self.tables[t].name or t}: parameter shape {tuple(param.shape)} != {tuple(view.shape)}")
                if param.device.type != "meta" and view.device.type != "meta":
                    view.copy_(param.detach().to(view.device))
                param.data = view
        self.table_weights = list(params)

    def load_optimizer_states(self, states: Sequence[Dict[str, torch.Tensor]]) -> None:
        """Copy per-table optimizer state (as returned by split_optimizer_states) into this kernel."""
        with torch.no_grad():
            for mine, theirs in zip(self.split_optimizer_states(), states):
                for name, tensor in mine.items():
                    if name in theirs:
                        tensor.copy_(theirs[name].reshape(tensor.shape))

    def __call__(self, indices, offsets, per_sample_weights=None, batch_size_per_feature=None) -> torch.Tensor:
        """The lookup; `batch_size_per_feature` (VBE): a batch size per feature, flat output (module docstring)."""
        if batch_size_per_feature is not None:
            self._vbe_bag_starts(batch_size_per_feature, offsets.numel() - 1)  # refuses tracing, checks sizes
            return self.forward(indices, offsets, per_sample_weights, batch_size_per_feature)
        if is_tracing():
            if self.optimizer is None or torch.compiler.is_exporting():  # export traces forward only: no update
                return traced_lookup(self, indices, offsets, per_sample_weights)
            return self._forward_outside_graph(indices, offsets, per_sample_weights)
        return self.forward(indices, offsets, per_sample_weights)

    @disabled_when_compiled(reason="a fused optimizer updates the tables in place from backward; build the "
                                  "collection with optimizer=None (dense gradients) to compile the lookup")
    def _forward_outside_graph(self, indices, offsets, per_sample_weights=None) -> torch.Tensor:
        self.sync_parameters()
        return self.forward(indices, offsets, per_sample_weights)

    def forward(self, indices, offsets, per_sample_weights=None, batch_size_per_feature=None) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        opt = "dense" if self.optimizer is None else f"{self.optimizer.optimizer.value}(lr={self.optimizer.lr})"
        return (f"{type(self).__name__}(backend={self.backend}, tables={len(self.tables)}, features={self.num_features}, "
                f"pooled={self.pooled}, optimizer={opt}, device={self.device})")


class _DimGroup:
    """Tables of one embedding dim, stored back to back as one [rows, dim] block of the flat storage."""

    def __init__(self, dim: int, table_ids: List[int], row_offsets: List[int], weight: torch.Tensor, state: Dict[str, torch.Tensor]):
        self.dim, self.table_ids, self.row_offsets, self.weight, self.state = dim, table_ids, row_offsets, weight, state


class TorchBatchedEmbedding(BatchedEmbeddingKernel):
    """Pure-torch kernel: one embedding_bag per embedding dim over concatenated tables, fused sparse updates."""

    backend = "torch"

    def __init__(self, tables, feature_table_map=None, pooling="sum", optimizer=None, device=None,
                 dtype=torch.float32, ids_out_of_range="error", feature_names=None,
                 storage: Optional[torch.Tensor] = None, state_storage: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """`storage` / `state_storage` (flat tensors, the tables back to back ordered by dim, stable): look up and
        update these instead of fresh zeros (the fbgemm kernel shares its own storage this way)."""
        super().__init__(tables, feature_table_map, pooling, optimizer, device, dtype, ids_out_of_range, feature_names)
        dims = sorted({t.embedding_dim for t in self.tables})
        order = [t for d in dims for t in range(len(self.tables)) if self.tables[t].embedding_dim == d]
        sizes = [self.tables[t].num_embeddings * self.tables[t].embedding_dim for t in range(len(self.tables))]
        if storage is not None:
            if storage.numel() != sum(sizes):
                raise ValueError(f"storage has {storage.numel()} elements, the tables need {sum(sizes)}")
            self.storage = storage.view(-1)
        elif self.device.type != "meta":
            self.storage = torch.zeros(sum(sizes), dtype=dtype, device=self.device)
        else:
            self.storage = torch.empty(sum(sizes), dtype=dtype, device="meta")
        self._element_offsets = [0] * len(self.tables)
        cursor = 0
        for t in order:
            self._element_offsets[t] = cursor
            cursor += sizes[t]
        self.groups: List[_DimGroup] = []
        self._table_group = [0] * len(self.tables)
        self._table_row_offset = [0] * len(self.tables)
        rows_before = 0
        for g, dim in enumerate(dims):
            ids = [t for t in order if self.tables[t].embedding_dim == dim]
            start = self._element_offsets[ids[0]]
            rows = sum(self.tables[t].num_embeddings for t in ids)
            block = self.storage[start:start + rows * dim].view(rows, dim)
            row_offsets, r = [], 0
            for t in ids:
                row_offsets.append(r)
                self._table_group[t], self._table_row_offset[t] = g, r
                r += self.tables[t].num_embeddings
            state = init_optimizer_state(optimizer, rows, dim, self.device) if optimizer is not None else {}
            if state_storage is not None:  # the same shapes, read from the shared flat state
                state = {name: state_storage[name].view(-1)[start if s.dim() == 2 else rows_before:][:s.numel()]
                         .view(s.shape) for name, s in state.items()}  # per element, or per row (row-wise)
            rows_before += rows
            self.groups.append(_DimGroup(dim, ids, row_offsets, block, state))
        self._feature_group = [self._table_group[t] for t in self.feature_table_map]
        self._feature_row_shift = torch.tensor(
            [self._table_row_offset[t] for t in self.feature_table_map], dtype=torch.int64, device=self.device)
        self.table_weights = [torch.nn.Parameter(view) for view in self.split_embedding_weights()]
        self._fused_anchor = torch.zeros(1, requires_grad=True, device=self.device)

    def split_embedding_weights(self) -> List[torch.Tensor]:
        return [self.storage[self._element_offsets[t]: self._element_offsets[t] + s.num_embeddings * s.embedding_dim]
                .view(s.num_embeddings, s.embedding_dim) for t, s in enumerate(self.tables)]

    def split_optimizer_states(self) -> List[Dict[str, torch.Tensor]]:
        out = []
        for t, spec in enumerate(self.tables):
            group = self.groups[self._table_group[t]]
            r = self._table_row_offset[t]
            out.append({name: s[r:r + spec.num_embeddings] for name, s in group.state.items()})
        return out

    def forward(self, indices, offsets, per_sample_weights=None, batch_size_per_feature=None) -> torch.Tensor:
        ids, offsets, batch_size, ids_per_feature = self.prepare_ids(indices, offsets, batch_size_per_feature)
        if per_sample_weights is not None:
            if not self.pooled:
                raise ValueError("per_sample_weights need pooling 'sum' (weighted bags)")
            per_sample_weights = per_sample_weights.to(device=self.device, dtype=torch.float32)
        rows = ids + self.per_id(self._feature_row_shift, ids_per_feature, ids.numel()) if len(self.tables) > 1 else ids
        bags = [batch_size] * self.num_features if batch_size_per_feature is None else [int(b) for b in batch_size_per_feature]
        batch = _Batch(rows, offsets, batch_size, ids_per_feature, bags)
        anchors = [self._fused_anchor] if self.optimizer is not None else self.table_weights
        return _TorchLookup.apply(self, batch, per_sample_weights, *anchors)

    # The two halves of _TorchLookup, per dim group.
    def _group_inputs(self, batch: "_Batch", g: int, psw: Optional[torch.Tensor]) -> tuple:
        """(rows, offsets, psw, features, take) of group g; take (positions in the batch) is None for one group."""
        if len(self.groups) == 1:
            return batch.rows, batch.offsets, psw, list(range(self.num_features)), None
        features = [f for f in range(self.num_features) if self._feature_group[f] == g]
        bag_starts = batch.bag_starts
        starts = batch.offsets[bag_starts].tolist()
        pieces = [torch.arange(starts[f], starts[f + 1], device=self.device) for f in features]
        take = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.int64, device=self.device)
        all_lengths = batch.offsets.diff()
        lengths = torch.cat([all_lengths.new_zeros(0)] + [all_lengths[bag_starts[f]:bag_starts[f + 1]] for f in features])
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        return batch.rows[take], offsets, (psw[take] if psw is not None else None), features, take

    def _forward_compute(self, batch: "_Batch", psw: Optional[torch.Tensor]) -> torch.Tensor:
        if not self.pooled:
            return F.embedding(batch.rows, self.groups[0].weight).float()
        B = batch.batch_size
        if self.device.type == "meta":  # shapes only: the bags' offsets hold no values to group by
            if B is None:
                return torch.empty(sum(b * d for b, d in zip(batch.bags, self.feature_dims)), device="meta")
            return torch.empty(B, sum(self.feature_dims), device="meta")
        per_feature: Dict[int, torch.Tensor] = {}
        for g, group in enumerate(self.groups):
            rows, offsets, group_psw, features, _ = self._group_inputs(batch, g, psw)
            if group_psw is not None:  # embedding_bag takes them in the table's dtype (fp16, bf16, fp64 tables)
                group_psw = group_psw.to(group.weight.dtype)
            pooled = F.embedding_bag(rows, group.weight, offsets, mode="sum", per_sample_weights=group_psw,
                                     include_last_offset=True).float()
            if B is None:  # VBE: the flat output, feature after feature, each [B_f, dim] row-major
                if len(self.groups) == 1:
                    return pooled.reshape(-1)
                per_feature.update(zip(features, pooled.reshape(-1).split([batch.bags[f] * group.dim for f in features])))
                continue
            pooled = pooled.view(len(features), B, group.dim).transpose(0, 1)  # [B, F_g, dim]
            if len(self.groups) == 1:
                return pooled.reshape(B, len(features) * group.dim)  # (not -1: B may be 0)
            for local, f in enumerate(features):
                per_feature[f] = pooled[:, local]
        return torch.cat([per_feature[f] for f in range(self.num_features)], dim=0 if B is None else 1)

    def _backward_compute(self, batch: "_Batch", psw: Optional[torch.Tensor], grad_out: torch.Tensor, need_psw_grad: bool):
        B = batch.batch_size
        table_grads: List[Optional[torch.Tensor]] = [None] * len(self.tables)
        psw_grad = torch.zeros_like(psw) if (need_psw_grad and psw is not None) else None
        column_starts, flat_starts = [0], [0]
        for d, bags in zip(self.feature_dims, batch.bags):
            column_starts.append(column_starts[-1] + d)
            flat_starts.append(flat_starts[-1] + bags * d)
        if self.optimizer is not None:
            self.num_updates += 1
        for g, group in enumerate(self.groups):
            rows, offsets, group_psw, features, take = self._group_inputs(batch, g, psw)
            if self.pooled:
                if B is None:  # VBE: grad_out is flat, feature after feature, [B_f, dim] each
                    grad_bags = grad_out.view(-1, group.dim) if len(self.groups) == 1 else torch.cat(
                        [grad_out[flat_starts[f]:flat_starts[f + 1]] for f in features]).view(-1, group.dim)
                elif len(self.groups) == 1:
                    grad_bags = grad_out.reshape(B, len(features), group.dim).transpose(0, 1).reshape(-1, group.dim)
                else:
                    grad_bags = torch.cat([grad_out[:, column_starts[f]:column_starts[f + 1]].t() for f in features], 0) \
                        .reshape(len(features), group.dim, B).transpose(1, 2).reshape(-1, group.dim)
                bag_of_id = _bag_of_id(offsets, rows.numel())
                if psw_grad is not None:
                    value = (grad_bags.index_select(0, bag_of_id) * group.weight.index_select(0, rows).float()).sum(1)
                    if take is None:
                        psw_grad = value
                    else:
                        psw_grad[take] = value
            else:
                grad_bags, bag_of_id = grad_out, torch.arange(rows.numel(), device=self.device)
            if self.optimizer is not None and self.optimizer.gradient_clipping:  # fbgemm's: each bag's gradient
                grad_bags = grad_bags.clamp(-self.optimizer.max_gradient, self.optimizer.max_gradient)
            # Sum the gradients of duplicate ids ("exact" updates): sort the ids, then pool each unique row's
            # bag gradients with embedding_bag, which avoids materializing one gradient row per id.
            sorted_rows, order = torch.sort(rows)
            unique_rows, counts = torch.unique_consecutive(sorted_rows, return_counts=True)
            grad_rows = F.embedding_bag(
                bag_of_id[order], grad_bags.float(), torch.cat([counts.new_zeros(1), counts.cumsum(0)]), mode="sum",
                per_sample_weights=group_psw[order] if group_psw is not None else None, include_last_offset=True)
            if self.optimizer is not None:
                apply_row_update(self.optimizer, group.weight, group.state, unique_rows, grad_rows, self.num_updates)
                continue
            bounds = torch.tensor(group.row_offsets[1:], device=self.device)
            table_of_row = torch.bucketize(unique_rows, bounds, right=True)
            for local, t in enumerate(group.table_ids):
                mask = table_of_row == local
                dense = torch.zeros(self.tables[t].num_embeddings, group.dim, dtype=self.dtype, device=self.device)
                dense.index_add_(0, unique_rows[mask] - group.row_offsets[local], grad_rows[mask].to(self.dtype))
                table_grads[t] = dense
        return psw_grad, table_grads


def _bag_of_id(offsets: torch.Tensor, num_ids: int) -> torch.Tensor:
    """The bag index of every id, from offsets (a cumulative count of bag starts; faster than repeat_interleave)."""
    marker = torch.zeros(num_ids + 1, dtype=torch.int64, device=offsets.device)
    marker.index_add_(0, offsets[1:-1], torch.ones_like(offsets[1:-1]))
    return marker[:num_ids].cumsum(0)


@dataclass
class _Batch:
    rows: torch.Tensor  # ids shifted into their dim group's block
    offsets: torch.Tensor
    batch_size: Optional[int]  # None: a batch size per feature (VBE)
    ids_per_feature: torch.Tensor
    bags: List[int]  # per feature

    @property
    def bag_starts(self) -> List[int]:
        """The first bag of every feature, and the end."""
        starts = [0]
        for n in self.bags:
            starts.append(starts[-1] + n)
        return starts


class _TorchLookup(torch.autograd.Function):
    """Forward: batched lookup. Backward: fused row update (returns no weight grad) or dense per-table grads."""

    @staticmethod
    def forward(ctx, kernel: TorchBatchedEmbedding, batch: _Batch, psw: Optional[torch.Tensor], *anchors: torch.Tensor):
        ctx.kernel, ctx.batch, ctx.psw, ctx.num_anchors = kernel, batch, psw, len(anchors)
        return kernel._forward_compute(batch, psw)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        kernel: TorchBatchedEmbedding = ctx.kernel
        psw_grad, table_grads = kernel._backward_compute(ctx.batch, ctx.psw, grad_out.contiguous(), ctx.needs_input_grad[2])
        anchor_grads = [None] * ctx.num_anchors if kernel.optimizer is not None else table_grads
        return (None, None, psw_grad, *anchor_grads)


def make_batched_embedding(
    tables: Sequence[TableSpec],
    feature_table_map: Optional[Sequence[int]] = None,
    pooling: str = "sum",
    optimizer: Optional[FusedOptimizerConfig] = None,
    device: Union[str, torch.device, None] = None,
    backend: str = "auto",
    dtype: torch.dtype = torch.float32,
    ids_out_of_range: str = "error",
    feature_names: Optional[Sequence[str]] = None,
) -> BatchedEmbeddingKernel:
    """Build the kernel for these tables on `backend` ("auto" | "torch" | "fbgemm"); see the module docstring."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    chosen = choose_backend(backend, optimizer, device, dtype, tables, feature_table_map)
    if chosen == "fbgemm":
        from rectoolkit.kernels.fbgemm_embedding import FbgemmBatchedEmbedding

        return FbgemmBatchedEmbedding(tables, feature_table_map, pooling, optimizer, device, dtype, ids_out_of_range, feature_names)
    return TorchBatchedEmbedding(tables, feature_table_map, pooling, optimizer, device, dtype, ids_out_of_range, feature_names)
