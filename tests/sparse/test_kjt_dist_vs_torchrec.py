"""KeyedJaggedTensor's all-to-all helpers (dist_labels, dist_splits, dist_tensors, dist_init) against TorchRec 1.8
on the same inputs, plus hand-worked rebuilds and the errors."""

from __future__ import annotations

import doctest

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.sparse import kjt_dist

torchrec = pytest.importorskip("torchrec")
_get_recat = pytest.importorskip("torchrec.distributed.dist_data")._get_recat


def _kjt(lib, weighted=False, variable=False):
    keys = ["a", "b", "c"]
    lengths = torch.tensor([1, 0, 2, 1, 1, 1]) if not variable else torch.tensor([2, 1, 0, 1, 1, 1])
    values = torch.arange(6)
    weights = torch.arange(6, dtype=torch.float) / 10 if weighted else None
    if variable:  # a: 1 sample, b: 3, c: 2
        return lib.KeyedJaggedTensor(keys=keys, values=values + 10 * weighted, weights=weights, lengths=lengths,
                                     stride_per_key_per_rank=[[1], [3], [2]])
    return lib.KeyedJaggedTensor(keys=keys, values=values, weights=weights, lengths=lengths)


def _assert_kjt_equal(ours, theirs):
    assert ours.keys() == theirs.keys()
    torch.testing.assert_close(ours.values(), theirs.values())
    torch.testing.assert_close(ours.lengths(), theirs.lengths())
    torch.testing.assert_close(ours.weights_or_none(), theirs.weights_or_none())
    assert ours.stride() == theirs.stride()
    assert ours.stride_per_key() == theirs.stride_per_key()
    assert ours.length_per_key() == theirs.length_per_key()
    assert ours.variable_stride_per_key() == theirs.variable_stride_per_key()
    assert ours.stride_per_key_per_rank() == [list(row) for row in theirs.stride_per_key_per_rank()]


def test_docstring_examples():
    assert doctest.testmod(kjt_dist).failed == 0


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("key_splits", [[2, 1], [1, 1, 1], [0, 3], [3]])
def test_labels_splits_tensors_match_torchrec(weighted, variable, key_splits):
    ours, theirs = _kjt(rtk, weighted, variable), _kjt(torchrec, weighted, variable)
    assert ours.dist_labels() == theirs.dist_labels()
    assert ours.dist_splits(key_splits) == theirs.dist_splits(key_splits)
    for mine, reference in zip(ours.dist_tensors(), theirs.dist_tensors(), strict=True):
        torch.testing.assert_close(mine, reference)


def _received(senders, key_splits, destination):
    """What `destination` receives from each sender (source-major), as an all-to-all would deliver it."""
    parts = []
    for kjt in senders:
        splits = kjt.dist_splits(key_splits)
        parts.append([t.split(s)[destination] for t, s in zip(kjt.dist_tensors(), splits)])
    return [torch.cat(column) for column in zip(*parts)]


def _senders(lib, weighted, variable, batch_sizes):
    """One KJT per source rank over keys a, b, c (deterministic values per rank)."""
    senders = []
    for rank, batch in enumerate(batch_sizes):
        generator = torch.Generator().manual_seed(rank)
        if variable:  # each key its own batch on this rank
            strides = [[batch], [batch + 1], [max(batch - 1, 0)]]
            num_lengths = sum(row[0] for row in strides)
        else:
            strides, num_lengths = None, 3 * batch
        lengths = torch.randint(0, 3, (num_lengths,), generator=generator)
        values = torch.randint(0, 100, (int(lengths.sum()),), generator=generator)
        weights = torch.rand(values.shape, generator=generator) if weighted else None
        senders.append(lib.KeyedJaggedTensor(keys=["a", "b", "c"], values=values, weights=weights, lengths=lengths,
                                             stride_per_key_per_rank=strides))
    return senders


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("variable", [False, True])
@pytest.mark.parametrize("batch_sizes", [[2, 2], [1, 3], [2, 0, 1]])
@pytest.mark.parametrize("with_recat", [True, False])
def test_dist_init_matches_torchrec(weighted, variable, batch_sizes, with_recat):
    num_workers = len(batch_sizes)
    key_splits = [2, 1] + [0] * (num_workers - 2)
    for destination, local_keys in enumerate([["a", "b"], ["c"]]):
        received = {}
        for name, lib in (("ours", rtk), ("theirs", torchrec)):
            tensors = _received(_senders(lib, weighted, variable, batch_sizes), key_splits, destination)
            equal = len(set(batch_sizes)) == 1
            recat = None
            if with_recat:
                recat = _get_recat(len(local_keys), num_workers,
                                   batch_size_per_rank=None if (equal or variable) else batch_sizes)
            received[name] = lib.KeyedJaggedTensor.dist_init(
                local_keys, tensors, variable, num_workers, recat, None if variable else batch_sizes)
        _assert_kjt_equal(received["ours"], received["theirs"])


def test_dist_init_variable_batch_with_stagger_matches_torchrec():
    kjts = {}
    for name, lib in (("ours", rtk), ("theirs", torchrec)):
        tensors = _received(_senders(lib, True, True, [1, 2, 3, 1]), [3, 0, 0, 0], 0)
        recat = _get_recat(3, 4, stagger=2)
        kjts[name] = lib.KeyedJaggedTensor.dist_init(["a", "b", "c"], tensors, True, 4, recat, None, stagger=2)
    _assert_kjt_equal(kjts["ours"], kjts["theirs"])


def test_dist_init_hand_worked():
    # two sources, batch 1 each, keys x y: received source-major [s0x, s0y, s1x, s1y]
    lengths = torch.tensor([1, 2, 0, 1])
    values = torch.tensor([10, 20, 21, 30])
    recat = torch.tensor([0, 2, 1, 3])  # key-major: s0x, s1x, s0y, s1y
    kjt = rtk.KeyedJaggedTensor.dist_init(["x", "y"], [lengths, values], False, 2, recat, [1, 1])
    assert kjt.stride() == 2
    assert kjt.lengths().tolist() == [1, 0, 2, 1]
    assert kjt.values().tolist() == [10, 20, 21, 30]
    assert kjt.length_per_key() == [1, 3]


def test_dist_init_errors_name_the_fault():
    lengths, values = torch.tensor([1, 1]), torch.tensor([1, 2])
    with pytest.raises(ValueError, match="got 1 tensors with variable_stride_per_key=False"):
        rtk.KeyedJaggedTensor.dist_init(["x"], [lengths], False, 2, None, [1, 1])
    with pytest.raises(ValueError, match="recat holds 5 but there are 2"):
        rtk.KeyedJaggedTensor.dist_init(["x"], [lengths, values], False, 2, torch.tensor([0, 5]), [1, 1])
    with pytest.raises(ValueError, match="stride_per_rank is required"):
        rtk.KeyedJaggedTensor.dist_init(["x"], [lengths, values], False, 2, None, None)
    with pytest.raises(ValueError, match="stagger=3 must be >= 1 and divide num_workers=2"):
        rtk.KeyedJaggedTensor.dist_init(["x"], [lengths, values], False, 2, None, [1, 1], stagger=3)
    with pytest.raises(ValueError, match="strides tensor has 1 entries"):
        rtk.KeyedJaggedTensor.dist_init(["x"], [lengths, values, torch.tensor([2])], True, 2, None, None)
    with pytest.raises(ValueError, match=r"key_splits=\[2, 2\]"):
        _kjt(rtk).dist_splits([2, 2])


def test_clear_storage_frees_like_torchrec():
    ours, theirs = _kjt(rtk, weighted=True), _kjt(torchrec, weighted=True)
    assert ours.clear_storage() == theirs.clear_storage()
    assert ours.values().untyped_storage().size() == 0
