"""Differential tests: every method of the jagged types against an installed TorchRec, random inputs."""

import pickle
import random

import pytest
import torch

import rectoolkit.sparse as ours

from helpers import assert_same_jt, assert_same_kjt, assert_same_tensor, random_kjt_inputs

torchrec = pytest.importorskip("torchrec")
theirs = torchrec.sparse.jagged_tensor

pytestmark = pytest.mark.torchrec

CASES = [
    # seed, num_keys, stride, weighted, lengths dtype
    (0, 1, 1, False, torch.int64),
    (1, 3, 4, True, torch.int32),
    (2, 5, 7, False, torch.int32),
    (3, 4, 3, True, torch.int64),
    (4, 8, 2, False, torch.int64),
]


def _pair(seed, num_keys, stride, weighted, dtype, from_offsets=False):
    inputs = random_kjt_inputs(seed, num_keys, stride, weighted, dtype)
    if from_offsets:
        lengths = inputs.pop("lengths")
        inputs["offsets"] = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0).to(lengths.dtype)])
    return ours.KeyedJaggedTensor(**inputs), theirs.KeyedJaggedTensor(**inputs)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("from_offsets", [False, True])
def test_kjt_accessors_and_str(case, from_offsets):
    a, b = _pair(*case, from_offsets=from_offsets)
    assert (a.lengths_or_none() is None) == (b.lengths_or_none() is None)
    assert (a.offsets_or_none() is None) == (b.offsets_or_none() is None)
    assert_same_kjt(a, b)
    assert a.index_per_key() == b.index_per_key()
    assert a.stride_per_key_per_rank() == b.stride_per_key_per_rank()
    assert a.size_in_bytes() == b.size_in_bytes()


@pytest.mark.parametrize("case", CASES)
def test_kjt_sync_constructors(case):
    inputs = random_kjt_inputs(*case)
    assert_same_kjt(ours.KeyedJaggedTensor.from_lengths_sync(**inputs), theirs.KeyedJaggedTensor.from_lengths_sync(**inputs))
    lengths = inputs.pop("lengths")
    inputs["offsets"] = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0).to(lengths.dtype)])
    assert_same_kjt(ours.KeyedJaggedTensor.from_offsets_sync(**inputs), theirs.KeyedJaggedTensor.from_offsets_sync(**inputs))


@pytest.mark.parametrize("case", CASES)
def test_kjt_getitem_and_to_dict(case):
    a, b = _pair(*case)
    for key in a.keys():
        assert_same_jt(a[key], b[key])
    da, db = a.to_dict(), b.to_dict()
    assert list(da) == list(db)
    for key in da:
        assert_same_jt(da[key], db[key])
        assert (da[key].offsets_or_none() is None) == (db[key].offsets_or_none() is None)


@pytest.mark.parametrize("case", CASES)
def test_kjt_from_jt_dict(case):
    a, b = _pair(*case)
    jts = b.to_dict()
    ours_jts = {k: ours.JaggedTensor(values=jt.values(), weights=jt.weights_or_none(), lengths=jt.lengths()) for k, jt in jts.items()}
    assert_same_kjt(ours.KeyedJaggedTensor.from_jt_dict(ours_jts), theirs.KeyedJaggedTensor.from_jt_dict(jts))


@pytest.mark.parametrize("case", CASES)
def test_kjt_permute_random_with_repeats_and_drops(case):
    rng = random.Random(case[0])
    for _ in range(3):
        a, b = _pair(*case)
        num_keys = len(a.keys())
        indices = [rng.randrange(num_keys) for _ in range(rng.randint(1, 2 * num_keys))]
        assert_same_kjt(a.permute(indices), b.permute(indices))
    a, b = _pair(*case)
    order = list(range(len(a.keys())))
    rng.shuffle(order)
    assert_same_kjt(a.permute(order), b.permute(order))


@pytest.mark.parametrize("case", CASES)
def test_kjt_split_and_concat(case):
    rng = random.Random(case[0])
    a, b = _pair(*case)
    remaining, segments = len(a.keys()), []
    while remaining:
        segments.append(rng.randint(1, remaining))
        remaining -= segments[-1]
    segments.insert(rng.randint(0, len(segments)), 0)
    parts_a, parts_b = a.split(segments), b.split(segments)
    assert len(parts_a) == len(parts_b)
    for pa, pb in zip(parts_a, parts_b):
        assert pa.keys() == pb.keys()
        assert_same_tensor(pa.values(), pb.values())
        assert_same_tensor(pa.lengths(), pb.lengths())
        assert_same_tensor(pa.weights_or_none(), pb.weights_or_none())
        if pa.keys():
            assert_same_kjt(pa, pb)
    assert_same_kjt(ours.KeyedJaggedTensor.concat(parts_a), theirs.KeyedJaggedTensor.concat(parts_b))


def test_kjt_empty_and_to_and_pickle():
    for weighted in (False, True):
        a = ours.KeyedJaggedTensor.empty(is_weighted=weighted, values_dtype=torch.int64)
        b = theirs.KeyedJaggedTensor.empty(is_weighted=weighted, values_dtype=torch.int64)
        assert_same_kjt(a, b)
    a, b = _pair(*CASES[1])
    assert_same_kjt(a.to(torch.device("cpu")), b.to(torch.device("cpu")))
    assert_same_kjt(a.to(torch.device("cpu"), dtype=torch.float64), b.to(torch.device("cpu"), dtype=torch.float64))
    assert_same_kjt(pickle.loads(pickle.dumps(a)), pickle.loads(pickle.dumps(b)))
    ea, eb = ours.KeyedJaggedTensor.empty_like(a), theirs.KeyedJaggedTensor.empty_like(b)
    assert ea.keys() == eb.keys() and ea.stride() == eb.stride()


JT_CASES = [(0, False, torch.int64), (1, True, torch.int32), (2, True, torch.int64), (3, False, torch.int32)]


def _jt_pair(seed, weighted, dtype):
    inputs = random_kjt_inputs(seed, 1, 6, weighted, dtype, max_length=5)
    inputs.pop("keys")
    inputs["values"] = inputs["values"].float()
    return ours.JaggedTensor(**inputs), theirs.JaggedTensor(**inputs)


@pytest.mark.parametrize("case", JT_CASES)
def test_jt_methods(case):
    a, b = _jt_pair(*case)
    assert_same_jt(a, b)
    assert [t.tolist() for t in a.to_dense()] == [t.tolist() for t in b.to_dense()]
    wa, wb = a.to_dense_weights(), b.to_dense_weights()
    assert (wa is None) == (wb is None)
    if wa is not None:
        assert [t.tolist() for t in wa] == [t.tolist() for t in wb]
    for desired, padding in [(None, 0.0), (2, -1.5), (9, 7.0), (0, 1.0)]:
        assert_same_tensor(a.to_padded_dense(desired, padding), b.to_padded_dense(desired, padding))
        assert_same_tensor(a.to_padded_dense_weights(desired, padding), b.to_padded_dense_weights(desired, padding))
    assert_same_jt(a.to(torch.device("cpu")), b.to(torch.device("cpu")))
    assert a.size_in_bytes() == b.size_in_bytes()


@pytest.mark.parametrize("case", JT_CASES)
def test_jt_from_dense(case):
    a, b = _jt_pair(*case)
    tensors = b.to_dense()
    weights = b.to_dense_weights()
    assert_same_jt(ours.JaggedTensor.from_dense(tensors, weights), theirs.JaggedTensor.from_dense(tensors, weights))
    padded = b.to_padded_dense()
    padded_weights = b.to_padded_dense_weights()
    assert_same_jt(
        ours.JaggedTensor.from_dense_lengths(padded, b.lengths(), padded_weights),
        theirs.JaggedTensor.from_dense_lengths(padded, b.lengths(), padded_weights),
    )


def test_jt_empty():
    for weighted in (False, True):
        assert_same_jt(ours.JaggedTensor.empty(weighted), theirs.JaggedTensor.empty(weighted))


def _kt_pair(seed, batch=3, num_keys=4, key_dim=1, same_width=False):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 5, (num_keys,), generator=generator).tolist()
    if same_width:
        lengths = [lengths[0]] * num_keys
    keys = [f"e{seed}_{i}" for i in range(num_keys)]
    shape = (batch, sum(lengths)) if key_dim == 1 else (sum(lengths), batch)
    values = torch.randn(shape, generator=generator)
    return (
        ours.KeyedTensor(keys=keys, length_per_key=lengths, values=values, key_dim=key_dim),
        theirs.KeyedTensor(keys=keys, length_per_key=lengths, values=values, key_dim=key_dim),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("key_dim", [0, 1])
def test_kt_methods(seed, key_dim):
    a, b = _kt_pair(seed, key_dim=key_dim)
    assert a.keys() == b.keys() and a.key_dim() == b.key_dim()
    assert a.length_per_key() == b.length_per_key() and a.offset_per_key() == b.offset_per_key()
    for key in a.keys():
        assert_same_tensor(a[key], b[key])
    da, db = a.to_dict(), b.to_dict()
    assert list(da) == list(db)
    for key in da:
        assert_same_tensor(da[key], db[key])
    assert str(a) == str(b)
    assert_same_tensor(a.to(torch.device("cpu")).values(), b.to(torch.device("cpu")).values())
    tensors = list(db.values())
    fa = ours.KeyedTensor.from_tensor_list(a.keys(), tensors, key_dim=key_dim, cat_dim=key_dim)
    fb = theirs.KeyedTensor.from_tensor_list(b.keys(), tensors, key_dim=key_dim, cat_dim=key_dim)
    assert fa.length_per_key() == fb.length_per_key()
    assert_same_tensor(fa.values(), fb.values())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("num_kts", [1, 3])
@pytest.mark.parametrize("same_width", [False, True])
def test_kt_regroup(seed, num_kts, same_width):
    rng = random.Random(seed)
    pairs = [_kt_pair(seed * 10 + i, num_keys=6, same_width=same_width) for i in range(num_kts)]
    all_keys = [k for a, _ in pairs for k in a.keys()]
    # Each key once (TorchRec's fast path), then with repeats/drops (its slow path).
    shuffled = all_keys[:]
    rng.shuffle(shuffled)
    cut = rng.randint(1, len(shuffled) - 1)
    for groups in ([shuffled[:cut], shuffled[cut:]], [rng.sample(all_keys, 3), rng.sample(all_keys, 5)]):
        ra = ours.KeyedTensor.regroup([a for a, _ in pairs], groups)
        rb = theirs.KeyedTensor.regroup([b for _, b in pairs], groups)
        assert len(ra) == len(rb)
        for x, y in zip(ra, rb):
            assert_same_tensor(x, y)
        names = [f"g{i}" for i in range(len(groups))]
        da = ours.KeyedTensor.regroup_as_dict([a for a, _ in pairs], groups, names)
        db = theirs.KeyedTensor.regroup_as_dict([b for _, b in pairs], groups, names)
        assert list(da) == list(db)
        for key in da:
            assert_same_tensor(da[key], db[key])
