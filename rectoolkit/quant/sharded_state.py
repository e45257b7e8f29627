"""The state_dict of a quantized collection sharded for inference: each table's stored rows on this rank, under the
unsharded module's keys ("embedding_bags.<table>.weight", sequences "embeddings.<table>.weight"), as TorchRec's.

    a table held whole here (table-wise)   the stored rows themselves, uint8 [rows, row bytes]: what the unsharded
                                           quantized module holds under that key (TorchRec's default mode)
    a table split here (row-, column-wise, ...)
                                           torch's ShardedTensorBase of this rank's shards, without a process group
                                           (TorchRec's split mode holds such a one): each shard's stored bytes at
                                           (its first row, its byte column: the column blocks held here side by
                                           side), sizes [rows, row bytes]
    a table with no shard here             no key (TorchRec's: none either)

The tensors are views of the shards' storage: `load_state_dict` copies into them (so the lookups read what was
loaded), from the same layout, or from the unsharded quantized module's state_dict (whole tables: a table-wise
shard takes the table, a row block its rows, a column block the codes of its columns with each row's scale and
bias, as sharding stores them). Every table is checked before any is copied.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from rectoolkit.distributed.state import collection_state_prefix, is_sharded_tensor
from rectoolkit.plan.types import ShardMetadata
from rectoolkit.quant.rowwise import row_size_in_bytes, slice_columns_rowwise


class StoredRowsState:
    """The state_dict and load_state_dict of a sharded quantized module (module docstring); the module gives
    `local_shards()` ((table, shard, stored rows, {}) of what it holds), `embedding_configs()` and
    `stored_layout` ({table: quantized DataType}, row alignment)."""

    def _save_to_state_dict(self, destination, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination.update(stored_state(self, prefix))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        load_stored_state(self, state_dict, prefix, missing_keys, unexpected_keys, error_msgs)


def _tables(module) -> Dict[str, List[Tuple[ShardMetadata, torch.Tensor]]]:
    held: Dict[str, List[Tuple[ShardMetadata, torch.Tensor]]] = {}
    for table, shard, rows, _ in module.local_shards():
        held.setdefault(table, []).append((shard, rows))
    return held


def _sizes(module) -> Dict[str, Tuple[int, int]]:
    return {c.name: (c.num_embeddings, c.embedding_dim) for c in module.embedding_configs()}


def _whole(shard: ShardMetadata, size: Tuple[int, int]) -> bool:
    return list(shard.shard_offsets) == [0, 0] and list(shard.shard_sizes) == list(size)


def _byte_offsets(held: List[Tuple[ShardMetadata, torch.Tensor]]) -> List[Tuple[int, int]]:
    """Each held shard's (row, byte column) in the table's stored layout on this rank: rows as the plan's; the
    column blocks held here side by side in column order, each as wide as its stored bytes (codes, scale, bias)."""
    widths: Dict[int, int] = {}
    for shard, rows in held:
        widths.setdefault(shard.shard_offsets[1], rows.shape[1])
    starts, total = {}, 0
    for column in sorted(widths):
        starts[column], total = total, total + widths[column]
    return [(shard.shard_offsets[0], starts[shard.shard_offsets[1]]) for shard, _ in held]


def stored_state(module, prefix: str = "") -> Dict[str, torch.Tensor]:
    """{key: the table's stored rows (a tensor or a ShardedTensorBase)} for every table with a shard here."""
    # (torch's ShardedTensor module costs 70 ms to import: loaded when first needed)
    from torch.distributed._shard.metadata import ShardMetadata as TorchShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensorBase
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    sizes, out, tables = _sizes(module), {}, _tables(module)
    for table, held in ((name, tables[name]) for name in sizes if name in tables):  # (the collection's order)
        key = f"{prefix}{collection_state_prefix(module)}{table}.weight"
        if len(held) == 1 and _whole(held[0][0], sizes[table]):
            out[key] = held[0][1]
            continue
        at = _byte_offsets(held)
        local = [Shard(rows, TorchShardMetadata(list(at[i]), list(rows.shape), f"rank:{shard.rank}/{rows.device}"))
                 for i, (shard, rows) in enumerate(held)]
        extent = [max(s.metadata.shard_offsets[d] + s.metadata.shard_sizes[d] for s in local) for d in (0, 1)]
        layout = ShardedTensorMetadata(shards_metadata=[s.metadata for s in local], size=torch.Size(extent),
                                       tensor_properties=TensorProperties(dtype=held[0][1].dtype))
        out[key] = ShardedTensorBase._init_from_local_shards_and_global_metadata(local, layout)
    return out


@torch.no_grad()
def load_stored_state(module, state_dict, prefix: str, missing_keys: List[str], unexpected_keys: List[str],
                      error_msgs: List[str]) -> None:
    """Copy each held table's saved rows into its shards (module docstring); report missing keys and errors as
    Module._load_from_state_dict does (the keys it takes are not unexpected). Every table is checked before any
    is copied: with an error, this module's shards are left as they were."""
    sizes = _sizes(module)
    copies: List[Tuple[torch.Tensor, torch.Tensor]] = []
    errors: List[str] = []
    tables = _tables(module)
    for table, held in ((name, tables[name]) for name in sizes if name in tables):  # (the collection's order)
        key = f"{prefix}{collection_state_prefix(module)}{table}.weight"
        if key in unexpected_keys:
            unexpected_keys.remove(key)
        if key not in state_dict:
            missing_keys.append(key)
            continue
        saved = state_dict[key]
        if is_sharded_tensor(saved):
            theirs = {(tuple(s.metadata.shard_offsets), tuple(s.metadata.shard_sizes)): s.tensor
                      for s in saved.local_shards()}
            for (shard, rows), at in zip(held, _byte_offsets(held)):
                source = theirs.get((tuple(at), tuple(rows.shape)))
                if source is None or source.dtype != rows.dtype:
                    errors.append(f"table {table!r}: the saved ShardedTensor has no shard at (row, byte) {list(at)} "
                                  f"of stored size {list(rows.shape)} (it holds {sorted(theirs)}): it was saved "
                                  "under another plan; load the unsharded quantized module's state_dict instead")
                    continue
                copies.append((rows, source))
            continue
        saved = torch.as_tensor(saved)
        data_types, row_alignment = module.stored_layout
        width = row_size_in_bytes(sizes[table][1], data_types[table], row_alignment)  # of the whole rows
        for shard, rows in held:
            (r0, r1), (c0, c1) = shard.rows, shard.columns
            if saved.dtype != rows.dtype or saved.dim() != 2 or saved.shape[0] < r1 or saved.shape[1] != width:
                errors.append(f"table {table!r}: got {saved.dtype} rows of shape {list(saved.shape)}; the table's "
                              f"stored rows are {rows.dtype}, {width} bytes each, and this shard needs rows "
                              f"{r0}..{r1}")
                continue
            block = saved[r0:r1]
            if (c0, c1) != (0, sizes[table][1]):  # a column block: its codes, with each row's scale and bias
                try:
                    block = slice_columns_rowwise(block, data_types[table], sizes[table][1], c0, c1, row_alignment)
                except (ValueError, RuntimeError) as error:
                    errors.append(f"table {table!r}: columns {c0}..{c1} of the saved rows: {error}")
                    continue
            if block.shape != rows.shape:
                errors.append(f"table {table!r}: the saved rows give the shard at (row {r0}, column {c0}) stored "
                              f"rows of shape {list(block.shape)}, it stores {list(rows.shape)} (another data type or "
                              "row alignment)")
                continue
            copies.append((rows, block))
    error_msgs.extend(errors)
    if not errors:
        for rows, source in copies:
            rows.copy_(source)
