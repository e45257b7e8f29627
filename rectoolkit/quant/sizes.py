"""Bytes of embedding tables per storage type, for the planner and the memory views.

The numbers are the quantized collections' real storage (rows padded to `row_alignment` bytes, fbgemm's
and TorchRec's layout), so an inference plan can be sized with the same function the modules allocate by.

    >>> import rectoolkit as rtk
    >>> table = rtk.EmbeddingBagConfig(name="t", num_embeddings=4096, embedding_dim=64)
    >>> quantized_table_bytes(table, "INT8"), quantized_table_bytes(table, "FP32")
    (327680, 1048576)
    >>> quantized_table_bytes(table, "INT8", row_alignment=1)   # fbgemm's CPU default: no padding
    278528
    >>> shard_bytes(rows=1000, cols=32, data_type="INT4")         # one shard of a row- or column-wise plan
    32000

A collection may mix storage types (one table FP32 beside an INT4 one, as TorchRec allows): `bytes_per_table`
sizes each table in its own data_type.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Sequence, Union

from rectoolkit.modules.configs import BaseEmbeddingConfig, DataType
from rectoolkit.quant.config import weight_data_type
from rectoolkit.quant.pruning import stored_rows
from rectoolkit.quant.rowwise import DEFAULT_ROW_ALIGNMENT, row_size_in_bytes

DataTypeLike = Union[DataType, str, "torch.dtype"]  # noqa: F821

SERVING_DATA_TYPES = (DataType.FP32, DataType.FP16, DataType.INT8, DataType.INT4, DataType.INT2)


def quantized_row_bytes(embedding_dim: int, data_type: DataTypeLike,
                        row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> int:
    """Bytes of one stored row: codes (+ 4 bytes fp16 scale/bias for INT types), padded to row_alignment."""
    return row_size_in_bytes(embedding_dim, weight_data_type(data_type), row_alignment)


def shard_bytes(rows: int, cols: int, data_type: DataTypeLike, row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> int:
    """Bytes of a [rows, cols] shard stored as `data_type` (each shard carries its own scale/bias per row)."""
    return rows * quantized_row_bytes(cols, data_type, row_alignment)


def quantized_table_bytes(table: BaseEmbeddingConfig, data_type: Optional[DataTypeLike] = None,
                          row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> int:
    """Bytes of a whole table stored as `data_type` (default: the table's own data_type); a pruned table stores
    only its `num_embeddings_post_pruning` rows (rectoolkit.quant.pruning)."""
    return shard_bytes(stored_rows(table), table.embedding_dim,
                       table.data_type if data_type is None else data_type, row_alignment)


def table_bytes_by_data_type(tables: Sequence[BaseEmbeddingConfig],
                             data_types: Iterable[DataTypeLike] = SERVING_DATA_TYPES,
                             row_alignment: int = DEFAULT_ROW_ALIGNMENT) -> Dict[str, Dict[str, int]]:
    """{table name: {data type name: bytes}} for every table and storage type.

    >>> import rectoolkit as rtk
    >>> t = rtk.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=64)
    >>> table_bytes_by_data_type([t], ["FP32", "INT8"])
    {'t': {'FP32': 2560, 'INT8': 800}}
    """
    kinds = [weight_data_type(d) for d in data_types]
    return {t.name: {k.value: quantized_table_bytes(t, k, row_alignment) for k in kinds} for t in tables}


def bytes_per_table(collection: Any, row_alignment: Optional[int] = None) -> Dict[str, int]:
    """{table name: bytes} of a quantized collection, or of a list of table configs, each table stored in its own
    `data_type` (tables of one collection may differ). `row_alignment` defaults to the collection's (else 16).

    >>> import rectoolkit as rtk
    >>> tables = [rtk.EmbeddingBagConfig(name="a", num_embeddings=10, embedding_dim=8, data_type=DataType.FP32),
    ...           rtk.EmbeddingBagConfig(name="b", num_embeddings=10, embedding_dim=8, data_type=DataType.INT4)]
    >>> bytes_per_table(tables)        # a: 8 x 4 = 32 bytes a row; b: 4 + 8 / 2 = 8 -> padded to 16
    {'a': 320, 'b': 160}
    """
    if isinstance(collection, (list, tuple)):
        tables = list(collection)
    elif hasattr(collection, "embedding_bag_configs"):
        tables = collection.embedding_bag_configs()
    elif hasattr(collection, "embedding_configs"):
        tables = collection.embedding_configs()
    else:
        raise TypeError(f"bytes_per_table: got a {type(collection).__name__}; pass a quantized EmbeddingBagCollection "
                        "or EmbeddingCollection, or a list of table configs")
    if row_alignment is None:
        row_alignment = getattr(collection, "row_alignment", DEFAULT_ROW_ALIGNMENT)
    return {t.name: quantized_table_bytes(t, row_alignment=row_alignment) for t in tables}
