"""JaggedTensor: hand-worked cases and validation errors."""

import pytest
import torch

from rectoolkit.sparse import JaggedTensor, validation_disabled


def test_lengths_give_offsets_and_samples():
    jt = JaggedTensor(values=torch.tensor([5, 7, 1]), lengths=torch.tensor([1, 2]))
    assert jt.offsets().tolist() == [0, 1, 3]
    assert [t.tolist() for t in jt.to_dense()] == [[5], [7, 1]]
    assert jt.offsets_or_none() is not None  # cached after the first call
    assert jt.weights_or_none() is None
    assert jt.to_dense_weights() is None


def test_offsets_give_lengths():
    jt = JaggedTensor(values=torch.arange(8.0), offsets=torch.tensor([0, 2, 2, 3, 4, 5, 8]))
    assert jt.lengths_or_none() is None
    assert jt.lengths().tolist() == [2, 0, 1, 1, 1, 3]
    assert [t.tolist() for t in jt.to_dense()] == [[0, 1], [], [2], [3], [4], [5, 6, 7]]


def test_to_padded_dense_pads_and_cuts():
    jt = JaggedTensor(
        values=torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
        weights=torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]),
        offsets=torch.tensor([0, 2, 2, 3, 4, 5, 8]),
    )
    dense = jt.to_padded_dense(desired_length=2, padding_value=10.0)
    assert dense.tolist() == [[1, 2], [10, 10], [3, 10], [4, 10], [5, 10], [6, 7]]
    assert jt.to_padded_dense().shape == (6, 3)
    weights = jt.to_padded_dense_weights(desired_length=2, padding_value=1.0)
    assert torch.allclose(weights, torch.tensor([[0.1, 0.2], [1, 1], [0.3, 1], [0.4, 1], [0.5, 1], [0.6, 0.7]]))


def test_to_padded_dense_same_without_fbgemm(monkeypatch):
    jt = JaggedTensor(values=torch.tensor([3, 1, 4, 1, 5]), lengths=torch.tensor([3, 0, 2]))
    with_default = jt.to_padded_dense(desired_length=2, padding_value=-1)
    monkeypatch.setenv("RECTOOLKIT_DISABLE_FBGEMM", "1")
    without = jt.to_padded_dense(desired_length=2, padding_value=-1)
    assert without.tolist() == [[3, 1], [-1, -1], [1, 5]]
    assert torch.equal(with_default, without)


def test_from_dense_and_from_dense_lengths():
    jt = JaggedTensor.from_dense([torch.tensor([1.0]), torch.tensor([]), torch.tensor([7.0, 8.0])])
    assert jt.lengths().dtype == torch.int32
    assert jt.lengths().tolist() == [1, 0, 2]
    assert jt.values().tolist() == [1.0, 7.0, 8.0]
    jt2 = JaggedTensor.from_dense_lengths(
        torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([1, 3]), weights=torch.ones(2, 3)
    )
    assert jt2.values().tolist() == [1, 4, 5, 6]
    assert jt2.weights().tolist() == [1.0] * 4


def test_empty():
    jt = JaggedTensor.empty(is_weighted=True, values_dtype=torch.int64)
    assert jt.values().numel() == 0 and jt.weights().numel() == 0
    assert jt.lengths().dtype == torch.int32
    assert str(jt) == 'JaggedTensor({\n    "values": [],\n    "weights": []\n})\n'


def test_str_layout():
    jt = JaggedTensor(values=torch.tensor([5, 7, 1]), lengths=torch.tensor([1, 2]))
    assert str(jt) == "JaggedTensor({\n    [[5], [7, 1]]\n})\n"


def test_to_device_keeps_data():
    jt = JaggedTensor(values=torch.tensor([5, 7, 1]), lengths=torch.tensor([1, 2]))
    moved = jt.to(torch.device("cpu"))
    assert moved is not jt
    assert moved.values().tolist() == [5, 7, 1] and moved.lengths().tolist() == [1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"values": torch.arange(1), "lengths": torch.tensor([1, 1])}, "lengths sum to 2 but values has only 1"),
        ({"values": torch.arange(3), "lengths": torch.tensor([4, -1])}, "sample 1 has length -1"),
        ({"values": torch.arange(3), "offsets": torch.tensor([1, 3])}, "offsets must start at 0"),
        ({"values": torch.arange(3), "offsets": torch.tensor([0, 2, 1, 3])}, "must not decrease"),
        ({"values": torch.arange(3), "offsets": torch.tensor([0, 2])}, "offsets end at 2 but values has 3"),
        ({"values": torch.arange(3), "lengths": torch.tensor([3]), "weights": torch.ones(2)}, "weights has 2"),
        ({"values": torch.arange(3), "lengths": torch.tensor([3.0])}, "integer dtype"),
        ({"values": torch.arange(3)}, "lengths or offsets"),
    ],
)
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JaggedTensor(**kwargs)


def test_validation_can_be_switched_off():
    bad = {"values": torch.arange(1), "lengths": torch.tensor([1, 1])}  # lengths count more values than there are
    JaggedTensor(**bad, validate=False)
    with validation_disabled():
        JaggedTensor(**bad)
    with pytest.raises(ValueError):
        JaggedTensor(**bad)


# ------------------------------------------------------------------ to_padded_dense: later TorchRec's padding options
PADDED_ROWS = [[1.0, 2.0], [], [3.0], [4.0], [5.0], [6.0, 7.0, 8.0]]


def _rows_jt(weights=False):
    values = torch.tensor([v for row in PADDED_ROWS for v in row])
    return JaggedTensor(values=values, lengths=torch.tensor([len(row) for row in PADDED_ROWS]),
                        weights=values * 10 if weights else None)


@pytest.mark.parametrize("pad_from_beginning, chop_from_beginning, expected", [
    (False, False, [[1, 2], [10, 10], [3, 10], [4, 10], [5, 10], [6, 7]]),  # TorchRec 1.8's (the default)
    (True, True, [[1, 2], [10, 10], [10, 3], [10, 4], [10, 5], [7, 8]]),  # later TorchRec's default
    (False, True, [[1, 2], [10, 10], [3, 10], [4, 10], [5, 10], [7, 8]]),
    (True, False, [[1, 2], [10, 10], [10, 3], [10, 4], [10, 5], [6, 7]]),
])
def test_to_padded_dense_pads_before_or_after_and_keeps_the_first_or_last_values(
        pad_from_beginning, chop_from_beginning, expected):
    jt = _rows_jt(weights=True)
    got = jt.to_padded_dense(desired_length=2, padding_value=10.0, pad_from_beginning=pad_from_beginning,
                             chop_from_beginning=chop_from_beginning)
    assert got.tolist() == expected
    weights = jt.to_padded_dense_weights(desired_length=2, padding_value=1.0, pad_from_beginning=pad_from_beginning,
                                         chop_from_beginning=chop_from_beginning)
    assert weights.tolist() == [[1.0 if v == 10 else 10.0 * v for v in row] for row in expected]


def test_to_padded_dense_from_the_beginning_longer_rows_2d_values_gradients_and_no_values():
    jt = _rows_jt()
    assert jt.to_padded_dense(pad_from_beginning=True).tolist() == [
        [0, 1, 2], [0, 0, 0], [0, 0, 3], [0, 0, 4], [0, 0, 5], [6, 7, 8]]  # N = the longest row
    values = torch.arange(12.0).view(6, 2).requires_grad_()  # [ids, 2]: rows of 2 numbers
    padded = JaggedTensor(values=values, lengths=torch.tensor([1, 0, 3, 2])).to_padded_dense(
        desired_length=2, padding_value=-1.0, pad_from_beginning=True, chop_from_beginning=True)
    assert padded.shape == (4, 2, 2)
    assert padded.tolist() == [[[-1, -1], [0, 1]], [[-1, -1], [-1, -1]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    padded.sum().backward()
    assert values.grad[:, 0].tolist() == [1, 0, 1, 1, 1, 1]  # the chopped value (row 2's first) gets no gradient
    empty = JaggedTensor(values=torch.zeros(0), lengths=torch.tensor([0, 0]))
    assert empty.to_padded_dense(desired_length=2, padding_value=5.0, pad_from_beginning=True).tolist() == [[5, 5],
                                                                                                          [5, 5]]
