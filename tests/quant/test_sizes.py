"""Table bytes per storage type equal what the quantized collections allocate."""

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection
from rectoolkit.quant.sizes import (
    bytes_per_table,
    quantized_row_bytes,
    quantized_table_bytes,
    shard_bytes,
    table_bytes_by_data_type,
)


@pytest.mark.parametrize("dim", [4, 8, 16, 24, 64, 128])
@pytest.mark.parametrize("row_alignment", [1, 4, 16])
def test_sizes_equal_allocated_storage(dim, row_alignment):
    table = rtk.EmbeddingBagConfig(name="t", num_embeddings=37, embedding_dim=dim)
    ebc = rtk.EmbeddingBagCollection([table])
    for data_type in ["FP32", "FP16", "INT8", "INT4", "INT2"]:
        qebc = QuantEmbeddingBagCollection.from_float(ebc, dtype=data_type, row_alignment=row_alignment)
        assert quantized_table_bytes(table, data_type, row_alignment) == qebc.storage_bytes()
        assert qebc.state_dict()["embedding_bags.t.weight"].shape == (37, quantized_row_bytes(dim, data_type, row_alignment))


def test_hand_worked_sizes():
    # int8 row of dim 64: 64 codes + 2 bytes fp16 scale + 2 bytes fp16 bias = 68 -> padded to 80
    assert quantized_row_bytes(64, torch.int8) == 80
    assert quantized_row_bytes(64, torch.quint4x2, row_alignment=1) == 36
    assert shard_bytes(rows=10, cols=32, data_type="FP16") == 640
    tables = [rtk.EmbeddingBagConfig(name="a", num_embeddings=100, embedding_dim=16),
              rtk.EmbeddingBagConfig(name="b", num_embeddings=10, embedding_dim=128)]
    assert table_bytes_by_data_type(tables, ["FP32", "INT8"]) == {
        "a": {"FP32": 6400, "INT8": 100 * 32}, "b": {"FP32": 5120, "INT8": 10 * 144}}


@pytest.mark.parametrize("row_alignment", [1, 16])
def test_bytes_per_table_of_a_mixed_collection(row_alignment):
    # issue 12: each table sized in its own storage type, as the collection allocates it
    tables = [rtk.EmbeddingBagConfig(name=n, num_embeddings=rows, embedding_dim=dim, feature_names=[n])
              for n, rows, dim in [("fp32", 10, 12), ("fp16", 20, 12), ("int8", 30, 12), ("int4", 40, 12),
                                   ("int2", 50, 12)]]
    qebc = QuantEmbeddingBagCollection.from_float(
        rtk.EmbeddingBagCollection(tables), dtype=torch.int8, row_alignment=row_alignment,
        per_table_weight_dtype={"fp32": torch.float32, "fp16": torch.float16, "int4": torch.quint4x2,
                                "int2": torch.quint2x4})
    # rows of dim 12: fp32 48 bytes, fp16 24, int8 4 + 12 = 16, int4 4 + 6 = 10, int2 4 + 3 = 7 (then padded)
    unpadded = {"fp32": 48, "fp16": 24, "int8": 16, "int4": 10, "int2": 7}
    padded = {n: -(-b // row_alignment) * row_alignment for n, b in unpadded.items()}
    rows = {t.name: t.num_embeddings for t in tables}
    expected = {n: rows[n] * padded[n] for n in rows}
    assert bytes_per_table(qebc) == expected
    assert {n: w.numel() for n, w in ((k.split(".")[1], v) for k, v in qebc.state_dict().items())} == expected
    assert sum(expected.values()) == qebc.storage_bytes()
    with pytest.raises(TypeError, match="pass a quantized EmbeddingBagCollection"):
        bytes_per_table(rtk.KeyedJaggedTensor.empty())
