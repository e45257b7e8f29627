"""KeyedJaggedTensor: hand-worked cases, validation errors, pickling."""

import pickle

import pytest
import torch

from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor, validation_disabled

from helpers import random_kjt_inputs, reference_offsets, reference_samples


def _kjt():
    # "product": [[1, 2, 1], [5]]   "user": [[2, 3], [4, 1]]
    return KeyedJaggedTensor(
        keys=["product", "user"],
        values=torch.tensor([1, 2, 1, 5, 2, 3, 4, 1]),
        lengths=torch.tensor([3, 1, 2, 2]),
    )


def test_accessors_hand_worked():
    kjt = _kjt()
    assert kjt.keys() == ["product", "user"]
    assert kjt.stride() == 2
    assert kjt.stride_per_key() == [2, 2]
    assert kjt.length_per_key() == [4, 4]
    assert kjt.offset_per_key() == [0, 4, 8]
    assert kjt.lengths_offset_per_key() == [0, 2, 4]
    assert kjt.offsets().tolist() == [0, 3, 4, 6, 8]
    assert kjt.variable_stride_per_key() is False
    assert kjt.sync() is kjt
    assert kjt.weights_or_none() is None
    assert kjt.inverse_indices_or_none() is None
    assert kjt.index_per_key() == {"product": 0, "user": 1}


def test_getitem_and_to_dict():
    kjt = _kjt()
    user = kjt["user"]
    assert isinstance(user, JaggedTensor)
    assert [t.tolist() for t in user.to_dense()] == [[2, 3], [4, 1]]
    as_dict = kjt.to_dict()
    assert list(as_dict) == ["product", "user"]
    assert as_dict["product"].offsets().tolist() == [0, 3, 4]
    assert as_dict["product"].lengths().tolist() == [3, 1]
    assert kjt.to_dict() is as_dict  # cached


def test_unknown_key_names_the_key():
    with pytest.raises(KeyError, match="'item'.*'product', 'user'"):
        _kjt()["item"]
    with pytest.raises(KeyError, match="'item'"):
        _kjt().permute(["item"])


def test_permute_with_names_repeats_and_drops():
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.tensor([1, 2, 3, 4, 5, 6]),
        weights=torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
        lengths=torch.tensor([1, 0, 2, 1, 0, 2]),
    )
    permuted = kjt.permute([2, 0, 2])
    assert permuted.keys() == ["c", "a", "c"]
    assert permuted.lengths().tolist() == [0, 2, 1, 0, 0, 2]
    assert permuted.values().tolist() == [5, 6, 1, 5, 6]
    assert torch.allclose(permuted.weights(), torch.tensor([0.5, 0.6, 0.1, 0.5, 0.6]))
    assert permuted.length_per_key() == [2, 1, 2]
    by_name = kjt.permute(["c", "a", "c"])
    assert torch.equal(by_name.values(), permuted.values())
    with pytest.raises(ValueError, match="index 3 is out of range for the 3 keys"):
        kjt.permute([3])


def test_split_hand_worked():
    kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=torch.arange(6), lengths=torch.tensor([1, 0, 2, 1, 0, 2]))
    first, empty, rest = kjt.split([1, 0, 2])
    assert first.keys() == ["a"] and first.values().tolist() == [0] and first.lengths().tolist() == [1, 0]
    assert empty.keys() == [] and empty.values().numel() == 0 and empty.stride() == 2
    assert rest.keys() == ["b", "c"] and rest.values().tolist() == [1, 2, 3, 4, 5]
    assert kjt.split([3])[0] is kjt
    with pytest.raises(ValueError, match="segments"):
        kjt.split([2, 2])


def test_concat_hand_worked():
    a = KeyedJaggedTensor(keys=["a"], values=torch.tensor([1]), lengths=torch.tensor([1, 0]))
    b = KeyedJaggedTensor(keys=["b"], values=torch.tensor([2, 3]), lengths=torch.tensor([0, 2]))
    both = KeyedJaggedTensor.concat([a, b])
    assert both.keys() == ["a", "b"]
    assert both.values().tolist() == [1, 2, 3]
    assert both.lengths().tolist() == [1, 0, 0, 2]
    assert both.length_per_key() == [1, 2]
    c = KeyedJaggedTensor(keys=["c"], values=torch.tensor([2]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="different strides"):
        KeyedJaggedTensor.concat([a, c])
    with_empty = KeyedJaggedTensor.concat([KeyedJaggedTensor.empty(), a, KeyedJaggedTensor.empty()])
    assert with_empty.keys() == ["a"] and with_empty.values().dtype == torch.int64  # not the empty's float32
    assert with_empty.lengths().tolist() == [1, 0] and with_empty.stride() == 2


def test_from_offsets_sync_matches_from_lengths():
    inputs = random_kjt_inputs(seed=3)
    offsets = torch.tensor(reference_offsets(inputs["lengths"].tolist()))
    kjt = KeyedJaggedTensor.from_offsets_sync(keys=inputs["keys"], values=inputs["values"], offsets=offsets)
    assert kjt.lengths().tolist() == inputs["lengths"].tolist()
    assert kjt.stride() == 5
    samples = reference_samples(inputs["values"].tolist(), inputs["lengths"].tolist())
    for k, key in enumerate(inputs["keys"]):
        assert [t.tolist() for t in kjt[key].to_dense()] == samples[k * 5 : (k + 1) * 5]


def test_empty_and_str():
    empty = KeyedJaggedTensor.empty(is_weighted=True)
    assert empty.keys() == [] and empty.stride() == 0 and empty.lengths().dtype == torch.int32
    assert str(empty) == "KeyedJaggedTensor()\n"
    assert str(_kjt()) == 'KeyedJaggedTensor({\n    "product": [[1, 2, 1], [5]],\n    "user": [[2, 3], [4, 1]]\n})\n'


def test_pickle_round_trip():
    inputs = random_kjt_inputs(seed=1, weighted=True)
    kjt = KeyedJaggedTensor(**inputs)
    kjt.to_dict()
    copy = pickle.loads(pickle.dumps(kjt))
    assert copy.keys() == kjt.keys()
    for name in ("values", "lengths", "weights", "offsets"):
        assert torch.equal(getattr(copy, name)(), getattr(kjt, name)())
    assert copy.length_per_key() == kjt.length_per_key()


def test_to_device_keeps_caches():
    kjt = _kjt().sync()
    moved = kjt.to(torch.device("cpu"), dtype=torch.float64)
    assert moved.length_per_key() == [4, 4] and moved.keys() == kjt.keys()
    assert torch.equal(moved.values(), kjt.values())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(values=torch.arange(7), lengths=torch.tensor([3, 1, 2, 2])), r"lengths sum to 8 but values has only 7.*'product', 'user'.*stride=2"),
        (dict(values=torch.arange(8), lengths=torch.tensor([3, 1, 5, -1])), r"key 'user', sample 1 has length -1"),
        (dict(values=torch.arange(8), lengths=torch.tensor([3, 1, 4])), r"lengths has 3 entries, not a multiple of the 2 keys"),
        (dict(values=torch.arange(8), lengths=torch.tensor([3, 1, 2, 2]), stride=3), r"len\(keys\) \* stride = 2 \* 3 = 6"),
        (dict(values=torch.arange(8), lengths=torch.tensor([3, 1, 2, 2]), weights=torch.ones(7)), r"weights has 7 entries but values has 8"),
        (dict(values=torch.arange(8), offsets=torch.tensor([1, 3, 4, 6, 8])), r"offsets must start at 0, got offsets\[0\] = 1"),
        (dict(values=torch.arange(8), offsets=torch.tensor([0, 3, 2, 6, 8])), r"offsets\[2\] = 2 < offsets\[1\] = 3 \(key 'product', sample 1\)"),
        (dict(values=torch.arange(8), offsets=torch.tensor([0, 3, 4, 6, 7])), r"offsets end at 7 but values has 8"),
        (dict(values=torch.arange(8), lengths=torch.tensor([3, 1, 2, 2]), length_per_key=[3, 5]), r"length_per_key=\[3, 5\]"),
    ],
)
def test_validation_errors_name_key_and_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        KeyedJaggedTensor(keys=["product", "user"], **kwargs)


def test_validation_switch():
    bad = dict(keys=["a"], values=torch.arange(1), lengths=torch.tensor([1, 1]))  # fewer values than counted
    with pytest.raises(ValueError):
        KeyedJaggedTensor(**bad)
    with pytest.raises(ValueError):
        KeyedJaggedTensor.from_lengths_sync(**bad)
    KeyedJaggedTensor(**bad, validate=False)
    with validation_disabled():
        KeyedJaggedTensor(**bad)


def test_from_jt_dict_with_different_batch_sizes_is_variable_batch():
    jts = {
        "a": JaggedTensor(values=torch.tensor([1]), lengths=torch.tensor([1])),
        "b": JaggedTensor(values=torch.tensor([2]), lengths=torch.tensor([1, 0])),
    }
    kjt = KeyedJaggedTensor.from_jt_dict(jts)
    assert kjt.variable_stride_per_key() is True
    assert kjt.stride_per_key_per_rank() == [[1], [2]]
    assert kjt.stride_per_key() == [1, 2]
    assert kjt["b"].lengths().tolist() == [1, 0]


def test_variable_batch_bad_input_names_key_and_numbers():
    good = dict(keys=["user", "item"], values=torch.arange(5), lengths=torch.tensor([2, 1, 1, 0, 1]),
                stride_per_key_per_rank=[[1], [4]])
    KeyedJaggedTensor(**good)
    with pytest.raises(ValueError, match=r"lengths has 5 entries but stride_per_key_per_rank gives 6 samples"):
        KeyedJaggedTensor(**{**good, "stride_per_key_per_rank": [[2], [4]]})
    with pytest.raises(ValueError, match=r"has 1 rows but there are 2 keys"):
        KeyedJaggedTensor(**{**good, "stride_per_key_per_rank": [[5]]})
    with pytest.raises(ValueError, match=r"key 'item', sample 2 has length -1"):
        KeyedJaggedTensor(**{**good, "values": torch.arange(3), "lengths": torch.tensor([2, 1, 1, -1, 0])})
    with pytest.raises(ValueError, match=r"lengths sum to 5 but values has 4 entries"):
        KeyedJaggedTensor(**{**good, "values": torch.arange(4)})
    inverse = (["user", "item"], torch.tensor([[0, 0, 0, 0], [0, 1, 2, 3]]))
    KeyedJaggedTensor(**good, inverse_indices=inverse)
    with pytest.raises(ValueError, match=r"inverse_indices of key 'user' hold 1, but the key has 1 samples"):
        KeyedJaggedTensor(**good, inverse_indices=(inverse[0], torch.tensor([[0, 1, 0, 0], [0, 1, 2, 3]])))
    with pytest.raises(ValueError, match=r"inverse_indices of key 'item' hold -1"):
        KeyedJaggedTensor(**good, inverse_indices=(inverse[0], torch.tensor([[0, 0, 0, 0], [0, 1, 2, -1]])))
    with pytest.raises(ValueError, match=r"integer tensor \[len\(keys\), batch size\]"):
        KeyedJaggedTensor(**good, inverse_indices=(inverse[0], torch.tensor([0, 0, 0, 0])))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_negative_length_found_for_either_lengths_dtype(dtype):
    # int64 lengths are checked through their 32-bit halves first: the exact check must still name the sample
    lengths = torch.tensor([3, 1, 5, -1], dtype=dtype)
    with pytest.raises(ValueError, match=r"key 'user', sample 1 has length -1"):
        KeyedJaggedTensor(keys=["product", "user"], values=torch.arange(8), lengths=lengths)
    big_negative = torch.tensor([3, 1, 4 + 2**32 + 5, -(2**32) - 5], dtype=torch.int64)  # sums to 8
    with pytest.raises(ValueError, match=rf"key 'user', sample 1 has length {-(2**32) - 5}"):
        KeyedJaggedTensor(keys=["product", "user"], values=torch.arange(8), lengths=big_negative)


def test_min_and_sum_per_row_sign_is_exact_for_int64_halves():
    from rectoolkit.sparse.jagged_ops import min_and_sum_per_row

    # 2**31 has a negative low half as int32 but is a valid length; -2**32 has a zero low half
    assert min_and_sum_per_row(torch.tensor([[2**31, 0], [1, 2]]), torch.int64) == [2**31, 3, 0]
    *sums, smallest = min_and_sum_per_row(torch.tensor([[2**32, -(2**32)], [1, 2]]), torch.int64)
    assert sums == [0, 3] and smallest == -(2**32)
    *sums, smallest = min_and_sum_per_row(torch.tensor([[5, 7]], dtype=torch.int32), torch.int32)
    assert sums == [12] and smallest == 5
