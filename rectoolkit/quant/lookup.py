"""Batched lookup over row-wise quantized tables: fbgemm's int-n-bit TBE op, or pure torch, same results.

All tables live in one flat uint8 buffer (rows of each table back to back, in the layout of
rectoolkit.quant.rowwise); a table's weight is a [rows, row bytes] view of it. Inputs follow fbgemm's TBE
layout: `indices` are the ids of feature 0 for bags 0..B-1, then of feature 1, ...; `offsets` has F * B + 1
entries; feature f reads table `feature_table_map[f]`.

    >>> import torch
    >>> from rectoolkit.modules.configs import DataType
    >>> lookup = QuantBatchedLookup([QuantTableSpec(10, 4, DataType.INT8), QuantTableSpec(6, 8, DataType.INT4)],
    ...                             feature_table_map=[0, 1], backend="torch")
    >>> lookup.table_weights()[0].shape                  # 4 codes + 4 bytes scale/bias, padded to 16
    torch.Size([10, 16])
    >>> out = lookup(torch.tensor([1, 2, 3, 5]), torch.tensor([0, 2, 3, 3, 4]))  # B = 2 bags per feature
    >>> out.shape                                        # [B, 4 + 8]
    torch.Size([2, 12])

The pure-torch path gathers the stored rows of the ids, dequantizes only those (value = scale * code + bias)
and sums each bag with `embedding_bag`; tables are grouped by (data type, dim) so the common case (one
data type, one dim) is one gather and one `embedding_bag` over all features. It uses only aten ops, so
`torch.export` captures it and the exported program runs without fbgemm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from rectoolkit.kernels.backend import fbgemm_available
from rectoolkit.modules.configs import DataType
from rectoolkit.quant.rowwise import (
    DEFAULT_ROW_ALIGNMENT,
    FLOAT_DATA_TYPES,
    SCALE_BIAS_BYTES,
    SPARSE_TYPE_INT,
    _check_data_type,
    _check_dim,
    _dequantize_torch,
    _unpack_codes,
    split_scale_bias,
    row_size_in_bytes,
    unpadded_row_size_in_bytes,
)

_DEVICE_PLACEMENT, _HOST_PLACEMENT = 0, 3  # fbgemm EmbeddingLocation.DEVICE / HOST
_CUDA_ROW_ALIGNMENT = 16  # fbgemm's CUDA int-n-bit kernels load rows in 16-byte vectors
_POOLING_SUM, _POOLING_NONE = 0, 2  # fbgemm PoolingMode
_OUTPUT_SPARSE_TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 5}


@dataclass(frozen=True)
class QuantTableSpec:
    """One stored table of a quantized lookup: rows, dim and storage type."""

    num_embeddings: int
    embedding_dim: int
    data_type: DataType
    name: str = ""


def choose_quant_backend(backend: str) -> str:
    """Resolve "auto" | "torch" | "fbgemm" to the lookup that will run."""
    if backend not in ("auto", "torch", "fbgemm"):
        raise ValueError(f"unknown quantized lookup backend {backend!r}; use 'auto', 'torch' or 'fbgemm'")
    if backend == "fbgemm" and not fbgemm_available():
        raise RuntimeError("backend='fbgemm' but fbgemm_gpu is not available (or RECTOOLKIT_DISABLE_FBGEMM=1)")
    if backend == "auto":
        return "fbgemm" if fbgemm_available() else "torch"
    return backend


class QuantBatchedLookup(nn.Module):
    """Pooled (sum) or per-id lookup of many quantized tables in one call; see the module docstring.

    Buffers are non-persistent: the owning collection exposes the per-table views in its state_dict.
    """

    def __init__(self, tables: Sequence[QuantTableSpec], feature_table_map: Optional[List[int]] = None,
                 pooled: bool = True, row_alignment: int = DEFAULT_ROW_ALIGNMENT, backend: str = "auto",
                 output_dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        super().__init__()
        if not tables:
            raise ValueError("QuantBatchedLookup needs at least one table")
        self.tables = [QuantTableSpec(t.num_embeddings, t.embedding_dim, _check_data_type(t.data_type), t.name)
                       for t in tables]
        for t in self.tables:
            try:
                _check_dim(t.embedding_dim, t.data_type)
            except ValueError as err:
                raise ValueError(f"table {t.name!r}: {err}") from None
        self.feature_table_map = list(feature_table_map) if feature_table_map is not None else list(range(len(tables)))
        bad = [t for t in self.feature_table_map if not 0 <= t < len(tables)]
        if bad:
            raise ValueError(f"feature_table_map refers to tables {bad} but there are {len(tables)} tables")
        self.pooled = pooled
        if not pooled and len({t.embedding_dim for t in self.tables}) > 1:
            raise ValueError("per-id (unpooled) lookup needs all tables to share one embedding_dim")
        if output_dtype not in _OUTPUT_SPARSE_TYPE:
            raise ValueError(f"output_dtype must be one of {list(_OUTPUT_SPARSE_TYPE)}, got {output_dtype}")
        self.output_dtype = output_dtype
        self.row_alignment = row_alignment
        self.backend = choose_quant_backend(backend)
        device = torch.device(device) if device is not None else torch.device("cpu")

        # Storage order: tables grouped by (data type, dim), so each group is one [rows, row bytes] view.
        group_keys: List[Tuple[DataType, int]] = []
        for t in self.tables:
            if (t.data_type, t.embedding_dim) not in group_keys:
                group_keys.append((t.data_type, t.embedding_dim))
        self.group_keys = group_keys
        self.row_bytes = [row_size_in_bytes(t.embedding_dim, t.data_type, row_alignment) for t in self.tables]
        storage_order = [i for key in group_keys for i, t in enumerate(self.tables)
                         if (t.data_type, t.embedding_dim) == key]
        self.byte_offsets = [0] * len(self.tables)
        position = 0
        for i in storage_order:
            self.byte_offsets[i] = position
            position += self.tables[i].num_embeddings * self.row_bytes[i]
        self.total_bytes = position
        # Per group: first byte, rows, and each table's first row inside the group.
        self.group_byte_ranges: List[Tuple[int, int]] = []
        self.group_row_offset: List[Dict[int, int]] = []
        for key in group_keys:
            members = [i for i in storage_order if (self.tables[i].data_type, self.tables[i].embedding_dim) == key]
            start = self.byte_offsets[members[0]]
            rows = 0
            offsets: Dict[int, int] = {}
            for i in members:
                offsets[i] = rows
                rows += self.tables[i].num_embeddings
            self.group_byte_ranges.append((start, rows))
            self.group_row_offset.append(offsets)
        self.feature_dims = [self.tables[t].embedding_dim for t in self.feature_table_map]
        self.total_dim = sum(self.feature_dims)

        num_features = len(self.feature_table_map)
        self.register_buffer("weights", torch.zeros(self.total_bytes, dtype=torch.uint8, device=device), persistent=False)
        self.register_buffer("rows_per_feature", torch.tensor(
            [self.tables[t].num_embeddings for t in self.feature_table_map], dtype=torch.int64, device=device),
            persistent=False)
        # Per group: row offset of each feature's table inside the group (0 for features of other groups)
        # and whether the feature belongs to the group.
        for g, key in enumerate(group_keys):
            offsets = [self.group_row_offset[g].get(t, 0) for t in self.feature_table_map]
            member = [t in self.group_row_offset[g] for t in self.feature_table_map]
            self.register_buffer(f"_group{g}_row_offset", torch.tensor(offsets, dtype=torch.int64, device=device),
                                 persistent=False)
            self.register_buffer(f"_group{g}_member", torch.tensor(member, dtype=torch.bool, device=device),
                                 persistent=False)
        self.group_features = [[f for f, t in enumerate(self.feature_table_map) if t in self.group_row_offset[g]]
                               for g in range(len(group_keys))]
        # fbgemm's op metadata: one entry per feature (its table's placement, byte offset and type).
        d_offsets = [0]
        for d in self.feature_dims:
            d_offsets.append(d_offsets[-1] + d)
        self.register_buffer("_weights_offsets", torch.tensor(
            [self.byte_offsets[t] for t in self.feature_table_map], dtype=torch.int64, device=device),
                             persistent=False)
        self.register_buffer("_weights_tys", torch.tensor(
            [SPARSE_TYPE_INT[self.tables[t].data_type] for t in self.feature_table_map], dtype=torch.uint8,
            device=device), persistent=False)
        self.register_buffer("_weights_placements", torch.full((num_features,), _HOST_PLACEMENT,
                                                               dtype=torch.int32, device=device), persistent=False)
        self._placement = _HOST_PLACEMENT  # what _weights_placements holds (kept on the host: no device sync)
        self.register_buffer("_d_offsets", torch.tensor(d_offsets, dtype=torch.int32, device=device), persistent=False)
        self.register_buffer("_feature_ids", torch.arange(num_features, dtype=torch.int64, device=device),
                             persistent=False)
        self.max_dim = {d: max([t.embedding_dim for t in self.tables if t.data_type == d], default=0)
                        for d in SPARSE_TYPE_INT}

    # ------------------------------------------------------------------ storage
    def table_weights(self) -> List[torch.Tensor]:
        """One [rows, row bytes] uint8 view of the flat storage per table."""
        return [self.weights[o:o + t.num_embeddings * b].view(t.num_embeddings, b)
                for t, o, b in zip(self.tables, self.byte_offsets, self.row_bytes)]

    def split_embedding_weights(self, split_scale_shifts: bool = True) -> List[Tuple[torch.Tensor,
                                                                                     Optional[torch.Tensor]]]:
        """fbgemm's IntNBitTableBatchedEmbeddingBagsCodegen.split_embedding_weights: per table, views of the
        storage: (codes [rows, code bytes], scale_bias [rows, 4]) for INT types, (values [rows, bytes], None) for
        FP16 / FP32, without the row padding; `split_scale_shifts=False`: (whole padded rows, None)."""
        splits: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = []
        for table, rows in zip(self.tables, self.table_weights()):
            if not split_scale_shifts:
                splits.append((rows, None))
                continue
            rows = rows[:, :unpadded_row_size_in_bytes(table.embedding_dim, table.data_type)]
            if table.data_type in FLOAT_DATA_TYPES:
                splits.append((rows, None))
            else:
                splits.append((rows[:, SCALE_BIAS_BYTES:], rows[:, :SCALE_BIAS_BYTES]))
        return splits

    def assign_embedding_weights(self, q_weight_list: Sequence[Tuple[torch.Tensor, Optional[torch.Tensor]]]) -> None:
        """fbgemm's assign_embedding_weights: copy, table by table, (codes, scale_bias or None) shaped as
        `split_embedding_weights()` gives them into the storage."""
        destinations = self.split_embedding_weights()
        if len(q_weight_list) != len(destinations):
            raise ValueError(f"assign_embedding_weights: {len(q_weight_list)} (weight, scale_bias) pairs for "
                             f"{len(destinations)} tables {[t.name for t in self.tables]}; give one per table")
        with torch.no_grad():
            for table, dest, given in zip(self.tables, destinations, q_weight_list):
                if not isinstance(given, (tuple, list)) or len(given) != 2:
                    raise ValueError(f"table {table.name!r}: expected a (weight, scale_bias) pair, got "
                                     f"{type(given).__name__}")
                for part, want, have in (("weight", dest[0], given[0]), ("scale_bias", dest[1], given[1])):
                    if (want is None) != (have is None):
                        raise ValueError(f"table {table.name!r} ({table.data_type.value}): {part} must be "
                                         f"{'None' if want is None else 'given'}, got "
                                         f"{'None' if have is None else tuple(have.shape)}")
                    if want is None:
                        continue
                    if tuple(have.shape) != tuple(want.shape) or have.dtype != torch.uint8:
                        raise ValueError(f"table {table.name!r} ({table.data_type.value}): {part} must be uint8 "
                                         f"{tuple(want.shape)} (as split_embedding_weights gives it), got "
                                         f"{have.dtype} {tuple(have.shape)}")
                    want.copy_(have)

    def _group_view(self, g: int) -> torch.Tensor:
        data_type, dim = self.group_keys[g]
        start, rows = self.group_byte_ranges[g]
        row_bytes = row_size_in_bytes(dim, data_type, self.row_alignment)
        return self.weights[start:start + rows * row_bytes].view(rows, row_bytes)

    def storage_bytes(self) -> int:
        """Bytes of all stored rows (the memory the tables take)."""
        return self.total_bytes

    # ------------------------------------------------------------------ lookup
    def forward(self, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Pooled: [B, total dim] (features in order); unpooled: [len(indices), dim]."""
        if per_sample_weights is not None and not self.pooled:
            raise ValueError("per_sample_weights only apply to pooled lookups (they weight each id of a bag)")
        # an exported program holds the aten lookup: fbgemm's op would make loading it need fbgemm_gpu imported
        # first (a process that imports only rectoolkit and torch failed to resolve the op)
        if self.backend == "fbgemm" and not torch.compiler.is_exporting():
            return self._forward_fbgemm(indices, offsets, per_sample_weights)
        return self._forward_torch(indices, offsets, per_sample_weights)

    def _fbgemm_placements(self) -> torch.Tensor:
        """fbgemm's op reads `dev_weights` for DEVICE placements and `uvm_weights` for HOST ones: the CPU op
        wants HOST, the CUDA op DEVICE. The buffers move with .to(), so this is decided at call time."""
        on_cuda = self.weights.device.type == "cuda"
        if on_cuda and self.row_alignment % _CUDA_ROW_ALIGNMENT:
            raise ValueError(
                f"fbgemm's CUDA lookup needs rows aligned to {_CUDA_ROW_ALIGNMENT} bytes, but this collection was "
                f"built with row_alignment={self.row_alignment}; quantize again with row_alignment=16 for CUDA "
                "(or use backend='torch')"
            )
        wanted = _DEVICE_PLACEMENT if on_cuda else _HOST_PLACEMENT
        if self._placement != wanted:
            self._weights_placements.fill_(wanted)
            self._placement = wanted
        return self._weights_placements

    def _forward_fbgemm(self, indices: torch.Tensor, offsets: torch.Tensor,
                        per_sample_weights: Optional[torch.Tensor]) -> torch.Tensor:
        placements = self._fbgemm_placements()
        if indices.device.type == "cpu":
            offsets = offsets.to(indices.dtype)  # fbgemm's CPU op wants the same int type for both
        else:
            indices, offsets = indices.int(), offsets.int()
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(torch.float32)
        return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
            dev_weights=self.weights,
            uvm_weights=self.weights.new_empty(0),
            weights_placements=placements,
            weights_offsets=self._weights_offsets,
            weights_tys=self._weights_tys,
            D_offsets=self._d_offsets,
            total_D=self.total_dim,
            max_int2_D=self.max_dim[DataType.INT2],
            max_int4_D=self.max_dim[DataType.INT4],
            max_int8_D=self.max_dim[DataType.INT8],
            max_float16_D=self.max_dim[DataType.FP16],
            max_float32_D=self.max_dim[DataType.FP32],
            indices=indices,
            offsets=offsets,
            pooling_mode=_POOLING_SUM if self.pooled else _POOLING_NONE,
            indice_weights=per_sample_weights,
            output_dtype=_OUTPUT_SPARSE_TYPE[self.output_dtype],
            lxu_cache_weights=self.weights.new_empty(0, 0),
            lxu_cache_locations=indices.new_empty(0, dtype=torch.int32),
            row_alignment=self.row_alignment,
            max_float8_D=0,
            fp8_exponent_bits=-1,
            fp8_exponent_bias=-1,
        )

    def _forward_torch(self, indices: torch.Tensor, offsets: torch.Tensor,
                       per_sample_weights: Optional[torch.Tensor]) -> torch.Tensor:
        num_features = len(self.feature_table_map)
        num_ids = indices.shape[0]
        num_bags = offsets.shape[0] - 1
        batch_size = num_bags // num_features
        offsets = offsets.to(torch.int64)
        lengths = offsets[1:] - offsets[:-1]
        ids_per_feature = lengths.view(num_features, batch_size).sum(1)
        feature_of_id = self._feature_ids.repeat_interleave(ids_per_feature, output_size=num_ids)
        indices = indices.to(torch.int64)
        single_group = len(self.group_keys) == 1
        results = []
        for g, (data_type, dim) in enumerate(self.group_keys):
            rows = indices + getattr(self, f"_group{g}_row_offset")[feature_of_id]
            weights = per_sample_weights.to(torch.float32) if per_sample_weights is not None else None
            if not single_group:  # ids of other groups read row 0 and count with weight 0
                member = getattr(self, f"_group{g}_member")[feature_of_id]
                rows = torch.where(member, rows, torch.zeros_like(rows))
                mask = member.to(torch.float32)
                weights = mask if weights is None else weights * mask
            if not self.pooled:
                values = _dequantize_torch(self._group_view(g)[rows], data_type, dim)
                results.append(values if single_group else values * weights[:, None])
                continue
            results.append(self._pooled_group(g, rows, offsets, weights).view(num_features, batch_size, dim))
        if not self.pooled:
            out = results[0]
            for r in results[1:]:
                out = out + r  # each id is non-zero in exactly one group
            return out.to(self.output_dtype)
        if single_group:
            out = results[0].transpose(0, 1).reshape(batch_size, self.total_dim)
        else:
            group_of_feature = {f: g for g, members in enumerate(self.group_features) for f in members}
            out = torch.cat([results[group_of_feature[f]][f] for f in range(num_features)], dim=1)
        return out.to(self.output_dtype)

    def _pooled_group(self, g: int, rows: torch.Tensor, offsets: torch.Tensor,
                      weights: Optional[torch.Tensor]) -> torch.Tensor:
        """Per-bag sums of one group's rows [bags, dim], without materializing dequantized rows where avoidable.

        INT: sum_i w_i (scale_i * code_i + bias_i) = embedding_bag(codes, weights w_i * scale_i) + sum_i w_i bias_i.
        Unpadded FP32 tables are read in place by embedding_bag.
        """
        data_type, dim = self.group_keys[g]
        table = self._group_view(g)
        start, num_rows = self.group_byte_ranges[g]
        if data_type == DataType.FP32 and table.shape[1] == dim * 4 and start % 4 == 0:
            floats = self.weights[start:start + num_rows * dim * 4].view(torch.float32).view(num_rows, dim)
            return F.embedding_bag(rows, floats, offsets, mode="sum", per_sample_weights=weights,
                                   include_last_offset=True)
        gathered = table[rows]
        positions = torch.arange(rows.shape[0], device=rows.device)
        if data_type in FLOAT_DATA_TYPES:
            return F.embedding_bag(positions, _dequantize_torch(gathered, data_type, dim), offsets, mode="sum",
                                   per_sample_weights=weights, include_last_offset=True)
        codes, scale, bias = split_scale_bias(gathered, data_type, dim)
        codes = _unpack_codes(codes, data_type, dim)
        scale, bias = scale.to(torch.float32), bias.to(torch.float32)
        if weights is not None:
            scale, bias = scale * weights, bias * weights
        pooled = F.embedding_bag(positions, codes, offsets, mode="sum", per_sample_weights=scale,
                                 include_last_offset=True)
        bias_sums = F.embedding_bag(positions, bias[:, None], offsets, mode="sum", include_last_offset=True)
        return pooled + bias_sums

    def extra_repr(self) -> str:
        kinds = ", ".join(f"{d.value}x{dim}" for d, dim in self.group_keys)
        return f"backend={self.backend}, tables={len(self.tables)}, groups=[{kinds}], bytes={self.total_bytes}"
