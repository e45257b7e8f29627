"""Criteo TSV reader on a small file written here, with the expected tensors worked out by hand."""

import math

import pytest
import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.train.criteo import CriteoTSV, parse_criteo_line

TABLES = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000 + i, embedding_dim=4, feature_names=[f"cat_{i}"])
          for i in range(26)]


def criteo_line(label, ints, cats):
    return "\t".join([str(label)] + ["" if v is None else str(v) for v in ints] + ["" if c is None else c for c in cats])


ROWS = [
    (1, [5, None, -2] + [0] * 10, ["68fd1e64", None] + ["0000000a"] * 24),
    (0, [None] * 13, [None] * 26),
    (1, list(range(13)), [f"{i:08x}" for i in range(26)]),
    (0, [100] * 13, ["ffffffff"] * 26),
    (1, [1] * 13, ["00000001"] * 26),
]


@pytest.fixture
def criteo_file(tmp_path):
    path = tmp_path / "day_0.tsv"
    path.write_text("\n".join(criteo_line(*row) for row in ROWS) + "\n")
    return path


def expected_dense(ints):
    return [math.log1p(max(v, 0)) if v is not None else 0.0 for v in ints]


def test_parse_line_keeps_missing_values_as_none():
    label, ints, cats = parse_criteo_line(criteo_line(*ROWS[0]))
    assert label == 1 and ints[:4] == [5, None, -2, 0] and cats[:3] == ["68fd1e64", None, "0000000a"]
    with pytest.raises(ValueError, match="has 3 tab-separated columns, expected 40"):
        parse_criteo_line("1\t2\t3", " 7 of x.tsv")


def test_batches_dense_ids_labels(criteo_file):
    batches = list(CriteoTSV(criteo_file, TABLES, batch_size=2))
    assert len(batches) == 2  # 5 lines -> 2 full batches of 2, the last line dropped
    dense, sparse, labels = batches[0]
    assert labels.tolist() == [1.0, 0.0]
    expected = torch.tensor([expected_dense(ROWS[0][1]), expected_dense(ROWS[1][1])])
    torch.testing.assert_close(dense, expected)
    assert dense[0, :3].tolist() == pytest.approx([math.log(6), 0.0, 0.0])
    assert sparse.keys() == [f"cat_{i}" for i in range(26)] and sparse.stride() == 2
    cat0, cat1, cat5 = sparse["cat_0"], sparse["cat_1"], sparse["cat_5"]
    assert cat0.lengths().tolist() == [1, 0] and cat0.values().tolist() == [0x68FD1E64 % 1000]
    assert cat1.lengths().tolist() == [0, 0]
    assert cat5.values().tolist() == [10 % 1005]
    dense, sparse, labels = batches[1]
    assert labels.tolist() == [1.0, 0.0]
    assert sparse["cat_7"].values().tolist() == [7 % 1007, 0xFFFFFFFF % 1007]


def test_ranks_take_their_slice_of_each_global_batch(criteo_file):
    rank0 = list(CriteoTSV(criteo_file, TABLES, batch_size=1, rank=0, world_size=2))
    rank1 = list(CriteoTSV(criteo_file, TABLES, batch_size=1, rank=1, world_size=2))
    assert [b.labels.tolist() for b in rank0] == [[1.0], [1.0]]  # lines 1 and 3
    assert [b.labels.tolist() for b in rank1] == [[0.0], [0.0]]  # lines 2 and 4
    assert rank0[1].sparse_features["cat_3"].values().tolist() == [3 % 1003]


def test_needs_26_features(criteo_file):
    with pytest.raises(ValueError, match="26 categorical columns but 3 features"):
        CriteoTSV(criteo_file, TABLES[:3], batch_size=2)
