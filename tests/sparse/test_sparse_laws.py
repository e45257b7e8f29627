"""Laws of the jagged types, checked on random inputs with hypothesis."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor
from rectoolkit.sparse.jagged_ops import lengths_to_offsets

from helpers import reference_offsets, reference_samples

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def kjts(draw, max_keys=5, max_stride=5):
    num_keys = draw(st.integers(1, max_keys))
    stride = draw(st.integers(0, max_stride))
    lengths = draw(st.lists(st.integers(0, 4), min_size=num_keys * stride, max_size=num_keys * stride))
    total = sum(lengths)
    values = draw(st.lists(st.integers(-1000, 1000), min_size=total, max_size=total))
    weighted = draw(st.booleans())
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    return KeyedJaggedTensor(
        keys=[f"k{i}" for i in range(num_keys)],
        values=torch.tensor(values, dtype=torch.int64),
        weights=torch.arange(total, dtype=torch.float32) / 7 if weighted else None,
        lengths=torch.tensor(lengths, dtype=dtype),
        stride=stride,
    )


def assert_same_kjt(a: KeyedJaggedTensor, b: KeyedJaggedTensor) -> None:
    assert a.keys() == b.keys()
    assert a.stride() == b.stride()
    assert a.lengths().tolist() == b.lengths().tolist()
    assert torch.equal(a.values(), b.values())
    if a.weights_or_none() is None:
        assert b.weights_or_none() is None
    else:
        assert torch.equal(a.weights(), b.weights())


@SETTINGS
@given(st.lists(st.integers(0, 6), max_size=30), st.sampled_from([torch.int32, torch.int64]))
def test_lengths_offsets_round_trip(lengths, dtype):
    lengths_tensor = torch.tensor(lengths, dtype=dtype)
    offsets = lengths_to_offsets(lengths_tensor)
    assert offsets.dtype == dtype
    assert offsets.tolist() == reference_offsets(lengths)
    jt = JaggedTensor(values=torch.zeros(sum(lengths)), offsets=offsets)
    assert jt.lengths().tolist() == lengths


@SETTINGS
@given(kjts())
def test_to_dict_from_jt_dict_round_trip(kjt):
    if kjt.stride() == 0:
        return  # a KJT with no samples has no per-key batch to rebuild from
    rebuilt = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())
    assert_same_kjt(rebuilt, kjt)


@SETTINGS
@given(kjts(), st.randoms(use_true_random=False))
def test_permute_then_inverse_is_identity(kjt, rng):
    order = list(range(len(kjt.keys())))
    rng.shuffle(order)
    inverse = [order.index(i) for i in range(len(order))]
    assert_same_kjt(kjt.permute(order).permute(inverse), kjt)


@SETTINGS
@given(kjts(), st.randoms(use_true_random=False))
def test_split_then_concat_is_identity(kjt, rng):
    remaining, segments = len(kjt.keys()), []
    while remaining:
        segment = rng.randint(1, remaining)
        segments.append(segment)
        remaining -= segment
    segments.insert(rng.randint(0, len(segments)), 0)  # an empty segment somewhere
    parts = kjt.split(segments)
    assert [len(p.keys()) for p in parts] == segments
    assert_same_kjt(KeyedJaggedTensor.concat(parts), kjt)


@SETTINGS
@given(kjts())
def test_getitem_matches_reference_loop(kjt):
    samples = reference_samples(kjt.values().tolist(), kjt.lengths().tolist())
    stride = kjt.stride()
    for k, key in enumerate(kjt.keys()):
        assert [t.tolist() for t in kjt[key].to_dense()] == samples[k * stride : (k + 1) * stride]
        assert kjt.to_dict()[key].offsets().tolist() == reference_offsets(kjt[key].lengths().tolist())


@SETTINGS
@given(st.lists(st.lists(st.floats(-10, 10, width=32), max_size=5), max_size=8))
def test_to_dense_from_dense_round_trip(samples):
    tensors = [torch.tensor(s, dtype=torch.float32) for s in samples]
    if not tensors:
        return
    jt = JaggedTensor.from_dense(tensors, weights=tensors)
    assert [t.tolist() for t in jt.to_dense()] == [t.tolist() for t in tensors]
    assert [t.tolist() for t in jt.to_dense_weights()] == [t.tolist() for t in tensors]
    width = max(len(s) for s in samples)
    padded = jt.to_padded_dense(padding_value=99.0)
    again = JaggedTensor.from_dense_lengths(padded, jt.lengths())
    assert torch.equal(again.values(), jt.values())
    for row, sample in zip(padded.tolist(), tensors):
        assert row == sample.tolist() + [99.0] * (width - len(sample))


def _fresh(kjt):
    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), stride=kjt.stride())


def _path_results(kjt):
    fresh = _fresh(kjt)
    jt = kjt[kjt.keys()[0]]
    floats = JaggedTensor(values=jt.values().float(), lengths=jt.lengths())
    return [
        fresh.offsets(),
        *[feature.offsets() for feature in _fresh(kjt).to_dict().values()],
        floats.to_padded_dense(desired_length=2, padding_value=-3.0),
        jt.to_padded_dense(),
    ]


@SETTINGS
@given(kjts())
def test_pure_torch_and_fbgemm_paths_agree(kjt):
    import os

    default = _path_results(kjt)
    os.environ["RECTOOLKIT_DISABLE_FBGEMM"] = "1"
    try:
        pure = _path_results(kjt)
    finally:
        del os.environ["RECTOOLKIT_DISABLE_FBGEMM"]
    for a, b in zip(default, pure):
        assert a.dtype == b.dtype and torch.equal(a, b)
