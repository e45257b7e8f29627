"""KeyedTensor: hand-worked cases and errors."""

import pytest
import torch

from rectoolkit.sparse import KeyedTensor


def _kt():
    # rows: "a" = [1, 1], "b" = [2, 1, 2], "c" = [3, 1, 2, 3], three samples
    tensors = [torch.tensor([[1, 1]] * 3), torch.tensor([[2, 1, 2]] * 3), torch.tensor([[3, 1, 2, 3]] * 3)]
    return KeyedTensor.from_tensor_list(["a", "b", "c"], tensors)


def test_accessors():
    kt = _kt()
    assert kt.keys() == ["a", "b", "c"]
    assert kt.key_dim() == 1
    assert kt.length_per_key() == [2, 3, 4]
    assert kt.offset_per_key() == [0, 2, 5, 9]
    assert kt.values()[0].tolist() == [1, 1, 2, 1, 2, 3, 1, 2, 3]
    assert kt["b"].tolist() == [[2, 1, 2]] * 3
    assert {k: v.tolist() for k, v in kt.to_dict().items()} == {
        "a": [[1, 1]] * 3,
        "b": [[2, 1, 2]] * 3,
        "c": [[3, 1, 2, 3]] * 3,
    }


def test_regroup_hand_worked():
    kt1 = KeyedTensor(keys=["a", "b"], length_per_key=[1, 2], values=torch.tensor([[1, 2, 3], [4, 5, 6]]))
    kt2 = KeyedTensor(keys=["c"], length_per_key=[1], values=torch.tensor([[7], [8]]))
    groups = KeyedTensor.regroup([kt1, kt2], [["c", "a"], ["b"], ["a", "b", "a"]])
    assert groups[0].tolist() == [[7, 1], [8, 4]]
    assert groups[1].tolist() == [[2, 3], [5, 6]]
    assert groups[2].tolist() == [[1, 2, 3, 1], [4, 5, 6, 4]]
    as_dict = KeyedTensor.regroup_as_dict([kt1, kt2], [["b"], ["c"]], ["x", "y"])
    assert as_dict["y"].tolist() == [[7], [8]]
    with pytest.raises(KeyError, match="'zz'"):
        KeyedTensor.regroup([kt1], [["zz"]])


def test_regroup_is_differentiable_and_copies():
    values = torch.ones(2, 3, requires_grad=True)
    kt = KeyedTensor(keys=["a", "b"], length_per_key=[1, 2], values=values)
    (out,) = KeyedTensor.regroup([kt], [["b"]])
    out.sum().backward()
    assert values.grad.tolist() == [[0, 1, 1], [0, 1, 1]]
    assert out.data_ptr() != values.data_ptr()


def test_str_and_errors():
    kt = KeyedTensor(keys=["a", "b"], length_per_key=[1, 1], values=torch.tensor([[1, 2]]))
    assert str(kt) == 'KeyedTensor({\n    "a": [[1]],\n    "b": [[2]]\n})\n'
    with pytest.raises(ValueError, match="sums to 3 but values has 2 entries along key_dim=1"):
        KeyedTensor(keys=["a", "b"], length_per_key=[1, 2], values=torch.zeros(4, 2))
    with pytest.raises(ValueError, match="2 keys but 1 entries"):
        KeyedTensor(keys=["a", "b"], length_per_key=[2], values=torch.zeros(4, 2))
    with pytest.raises(KeyError, match="'c'"):
        kt["c"]


def test_regroup_same_width_keys_hand_worked():
    # Three keys of width 2 in one KeyedTensor: the grouped path copies whole [batch, key, width] rows.
    values = torch.tensor([[1.0, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]], requires_grad=True)
    kt = KeyedTensor(keys=["a", "b", "c"], length_per_key=[2, 2, 2], values=values)
    first, second = KeyedTensor.regroup([kt], [["c", "a", "c"], ["b"]])
    assert first.tolist() == [[5, 6, 1, 2, 5, 6], [11, 12, 7, 8, 11, 12]]
    assert second.tolist() == [[3, 4], [9, 10]]
    first.sum().backward()
    assert values.grad.tolist() == [[1, 1, 0, 0, 2, 2], [1, 1, 0, 0, 2, 2]]


def test_an_empty_group_gives_an_empty_block_as_torchrec_gives_it():
    first, empty = KeyedTensor.regroup([_kt()], [["a"], []])
    assert first.tolist() == [[1, 1]] * 3
    assert empty.shape == (3, 0) and empty.dtype == torch.int64
    assert KeyedTensor.regroup_as_dict([_kt()], [[]], ["g"])["g"].shape == (3, 0)
