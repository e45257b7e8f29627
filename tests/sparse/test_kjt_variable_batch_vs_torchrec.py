"""Differential tests of the variable batch per key (VBE) KJT against TorchRec 1.8: same inputs, same results."""

import random

import pytest
import torch

import rectoolkit.sparse as ours

from helpers import assert_same_jt, assert_same_kjt, assert_same_tensor

torchrec = pytest.importorskip("torchrec")
theirs = torchrec.sparse.jagged_tensor

pytestmark = pytest.mark.torchrec

# seed, number of keys, ranks, weighted, with inverse indices
CASES = [(0, 2, 1, False, True), (1, 3, 2, True, False), (2, 4, 1, True, True), (3, 5, 3, False, False)]


def vbe_inputs(seed, num_keys, ranks, weighted, with_inverse):
    """A random VBE KJT's arguments: key k has its own samples per rank (zero allowed), lengths 0..3."""
    rng = random.Random(seed)
    stride_per_key_per_rank = [[rng.randint(0, 4) for _ in range(ranks)] for _ in range(num_keys)]
    for row in stride_per_key_per_rank[: num_keys if with_inverse else 1]:  # inverse indices need a sample to read
        row[0] = max(row[0], 1)
    samples = sum(map(sum, stride_per_key_per_rank))
    lengths = torch.tensor([rng.randint(0, 3) for _ in range(samples)])
    generator = torch.Generator().manual_seed(seed)
    inputs = dict(keys=[f"f{k}" for k in range(num_keys)],
                  values=torch.randint(0, 100, (int(lengths.sum()),), generator=generator),
                  lengths=lengths, stride_per_key_per_rank=stride_per_key_per_rank)
    if weighted:
        inputs["weights"] = torch.rand(int(lengths.sum()), generator=generator)
    if with_inverse:
        batch = 6
        rows = [[rng.randrange(sum(row)) for _ in range(batch)] for row in stride_per_key_per_rank]
        inputs["inverse_indices"] = (list(inputs["keys"]), torch.tensor(rows))
    return inputs


def pair(case):
    inputs = vbe_inputs(*case)
    return ours.KeyedJaggedTensor(**inputs), theirs.KeyedJaggedTensor(**inputs)


def assert_same_vbe_kjt(a, b):
    assert a.stride_per_key_per_rank() == b.stride_per_key_per_rank()
    assert_same_kjt(a, b)
    assert (a.inverse_indices_or_none() is None) == (b.inverse_indices_or_none() is None)
    if b.inverse_indices_or_none() is not None:
        assert a.inverse_indices()[0] == b.inverse_indices()[0]
        assert_same_tensor(a.inverse_indices()[1], b.inverse_indices()[1])


@pytest.mark.parametrize("case", CASES)
def test_vbe_accessors_getitem_and_to_dict(case):
    a, b = pair(case)
    assert_same_vbe_kjt(a, b)
    assert a.size_in_bytes() == b.size_in_bytes()
    for key in b.keys():
        assert_same_jt(a[key], b[key])
    da, db = a.to_dict(), b.to_dict()
    assert list(da) == list(db)
    for key in db:
        assert_same_jt(da[key], db[key])


@pytest.mark.parametrize("case", CASES)
def test_vbe_sync_constructors_and_offsets(case):
    inputs = vbe_inputs(*case)
    assert_same_vbe_kjt(ours.KeyedJaggedTensor.from_lengths_sync(**inputs),
                        theirs.KeyedJaggedTensor.from_lengths_sync(**inputs))
    lengths = inputs.pop("lengths")
    inputs["offsets"] = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    assert_same_vbe_kjt(ours.KeyedJaggedTensor.from_offsets_sync(**inputs),
                        theirs.KeyedJaggedTensor.from_offsets_sync(**inputs))


@pytest.mark.parametrize("case", CASES)
def test_vbe_split(case):
    a, b = pair(case)
    num_keys = len(b.keys())
    for segments in ([num_keys], [1, num_keys - 1], [0, num_keys], [num_keys - 1, 0, 1]):
        parts_a, parts_b = a.split(segments), b.split(segments)
        assert len(parts_a) == len(parts_b)
        for part_a, part_b in zip(parts_a, parts_b):
            if part_b.keys():
                assert_same_vbe_kjt(part_a, part_b)
            else:
                assert part_a.keys() == [] and part_a.stride_per_key_per_rank() == part_b.stride_per_key_per_rank()


@pytest.mark.parametrize("case", CASES)
def test_vbe_permute_with_repeats_and_drops(case):
    rng = random.Random(case[0])
    a, b = pair(case)
    num_keys = len(b.keys())
    for _ in range(3):
        indices = [rng.randrange(num_keys) for _ in range(rng.randint(1, 2 * num_keys))]
        assert_same_vbe_kjt(a.permute(indices), b.permute(indices))


@pytest.mark.parametrize("case", CASES)
def test_vbe_concat_flatten_and_from_jt_dict(case):
    a, b = pair(case)
    b2 = theirs.KeyedJaggedTensor(**{**vbe_inputs(case[0] + 10, *case[1:]),
                                     "keys": [f"g{k}" for k in range(case[1])]})
    a2 = ours.KeyedJaggedTensor(**{**vbe_inputs(case[0] + 10, *case[1:]), "keys": [f"g{k}" for k in range(case[1])]})
    if case[4]:  # the inverse indices' keys follow the keys
        b2 = theirs.KeyedJaggedTensor(**{**vbe_inputs(case[0] + 10, *case[1:]), "keys": b2.keys(),
                                         "inverse_indices": (b2.keys(), b2.inverse_indices()[1])})
        a2 = ours.KeyedJaggedTensor(**{**vbe_inputs(case[0] + 10, *case[1:]), "keys": a2.keys(),
                                       "inverse_indices": (a2.keys(), a2.inverse_indices()[1])})
    assert_same_vbe_kjt(ours.KeyedJaggedTensor.concat([a, a2]), theirs.KeyedJaggedTensor.concat([b, b2]))
    fresh_a, fresh_b = pair(case)
    assert_same_vbe_kjt(fresh_a.flatten_lengths(), fresh_b.flatten_lengths())
    # once stride() has been asked for (the inverse indices' batch size, if any), the flattened KJT keeps it
    assert fresh_a.stride() == fresh_b.stride()
    assert fresh_a.flatten_lengths().stride() == fresh_b.flatten_lengths().stride()
    jts = b.to_dict()
    ours_jts = {k: ours.JaggedTensor(values=jt.values(), weights=jt.weights_or_none(), lengths=jt.lengths())
                for k, jt in jts.items()}
    from_a, from_b = ours.KeyedJaggedTensor.from_jt_dict(ours_jts), theirs.KeyedJaggedTensor.from_jt_dict(jts)
    assert from_a.variable_stride_per_key() == from_b.variable_stride_per_key()
    assert_same_vbe_kjt(from_a, from_b)


def test_concat_refuses_mixing_variable_and_fixed_batches():
    a = ours.KeyedJaggedTensor(**vbe_inputs(*CASES[1]))
    fixed = ours.KeyedJaggedTensor(keys=["z"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="some KJTs have a variable batch per key and some do not"):
        ours.KeyedJaggedTensor.concat([a, fixed])
