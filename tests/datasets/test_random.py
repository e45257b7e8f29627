"""RandomRecDataset: shapes and ranges on small sizes, clear errors, and TorchRec 1.8's stream for a seed."""

from __future__ import annotations

import doctest

import pytest
import torch

import rectoolkit.datasets.random
from rectoolkit.datasets import RandomRecDataset


def test_docstring_examples():
    assert doctest.testmod(rectoolkit.datasets.random).failed == 0


def test_lengths_and_ids_stay_in_their_ranges():
    dataset = RandomRecDataset(keys=["a", "b"], batch_size=6, hash_sizes=[5, 50], ids_per_features=[3, 1],
                               min_ids_per_features=[1, 0], num_dense=2, manual_seed=1, num_batches=4,
                               num_generated_batches=0)
    batches = list(dataset)
    assert len(batches) == 4
    for batch in batches:
        kjt = batch.sparse_features
        assert kjt.stride() == 6 and batch.dense_features.shape == (6, 2) and batch.labels.shape == (6,)
        a, b = kjt["a"], kjt["b"]
        assert 1 <= int(a.lengths().min()) and int(a.lengths().max()) <= 3
        assert int(b.lengths().max()) <= 1
        assert all(0 <= v < 5 for v in a.values().tolist()) and all(0 <= v < 50 for v in b.values().tolist())
        assert set(batch.labels.tolist()) <= {0, 1}
    assert not torch.equal(batches[0].dense_features, batches[1].dense_features)  # fresh batches each step


def test_generated_batches_are_cycled():
    batches = list(RandomRecDataset(keys=["a"], batch_size=2, num_dense=1, manual_seed=0, num_batches=3,
                                    num_generated_batches=2))
    assert batches[2] is batches[0] and batches[1] is not batches[0]


def test_bad_arguments_name_the_numbers():
    with pytest.raises(ValueError, match=r"hash_sizes has 1 entries but there are 2 keys \['a', 'b'\]"):
        RandomRecDataset(keys=["a", "b"], batch_size=2, hash_sizes=[10])
    with pytest.raises(ValueError, match=r"feature 'a' has ids per bag in \[3, 2\]"):
        RandomRecDataset(keys=["a"], batch_size=2, ids_per_feature=2, min_ids_per_feature=3)
    with pytest.raises(TypeError, match="num_batches=None streams forever"):
        len(RandomRecDataset(keys=["a"], batch_size=2))


@pytest.mark.torchrec
@pytest.mark.parametrize("kwargs", [dict(ids_per_feature=3), dict(ids_per_features=[2, 4], hash_sizes=[7, 30]),
                                    dict(ids_per_feature=4, min_ids_per_feature=1, num_generated_batches=-1)])
def test_same_stream_as_torchrec_for_a_seed(kwargs):
    torchrec_random = pytest.importorskip("torchrec.datasets.random")
    common = dict(keys=["u", "i"], batch_size=3, num_dense=2, manual_seed=7, num_batches=3)
    ours = list(RandomRecDataset(**common, **kwargs))
    theirs = list(torchrec_random.RandomRecDataset(**common, **kwargs))
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.dense_features, b.dense_features)
        torch.testing.assert_close(a.labels, b.labels)
        assert a.sparse_features.keys() == b.sparse_features.keys()
        assert a.sparse_features.lengths().tolist() == b.sparse_features.lengths().tolist()
        assert a.sparse_features.values().tolist() == b.sparse_features.values().tolist()


@pytest.mark.torchrec
def test_batch_has_torchrecs_pin_memory_and_record_stream(monkeypatch):
    torchrec = pytest.importorskip("torchrec")
    from torchrec.datasets.utils import Batch as TheirBatch

    from rectoolkit.datasets.utils import Batch
    from rectoolkit.sparse import KeyedJaggedTensor

    touched = []  # CPU-only machine: stand-ins that record which tensors each method reaches
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: touched.append(("pin", self.tolist())) or self + 0)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: touched.append((stream, self.tolist())))

    def run(batch_class, kjt_class):
        touched.clear()
        batch = batch_class(torch.ones(2, 3), kjt_class.from_lengths_sync(["a"], torch.tensor([4, 5]),
                                                                          torch.tensor([2, 0]), torch.ones(2)),
                            torch.tensor([1, 0]))
        pinned = batch.pin_memory()
        batch.record_stream("s")
        return type(pinned) is batch_class, pinned.sparse_features.values().tolist(), set(map(repr, touched))

    ours, theirs = run(Batch, KeyedJaggedTensor), run(TheirBatch, torchrec.KeyedJaggedTensor)
    assert ours[:2] == theirs[:2] == (True, [4, 5])
    assert theirs[2] <= ours[2]  # every tensor TorchRec's Batch reaches (ours may also reach a KJT's offsets)
