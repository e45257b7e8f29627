"""jt_is_equal / kjt_is_equal at TorchRec's path give TorchRec 1.8's answers, on pairs built to differ in one way
each (and on equal pairs built differently: lengths against offsets)."""

import pytest
import torch

torchrec = pytest.importorskip("torchrec")
from torchrec.sparse import jagged_tensor as theirs  # noqa: E402

from rectoolkit.sparse import jagged_tensor as ours  # noqa: E402

pytestmark = pytest.mark.torchrec


def _jt(module, values, lengths=None, offsets=None, weights=None):
    return module.JaggedTensor(values=values, lengths=lengths, offsets=offsets, weights=weights)


JT_CASES = {
    "equal, lengths vs offsets": (dict(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([1, 2])),
                                  dict(values=torch.tensor([1.0, 2.0, 3.0]), offsets=torch.tensor([0, 1, 3]))),
    "other values": (dict(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([1, 2])),
                     dict(values=torch.tensor([1.0, 2.0, 4.0]), lengths=torch.tensor([1, 2]))),
    "other lengths": (dict(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([1, 2])),
                      dict(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([2, 1]))),
    "more values": (dict(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([1, 2])),
                    dict(values=torch.tensor([1.0, 2.0, 3.0, 4.0]), lengths=torch.tensor([1, 3]))),
    "weights on one side": (dict(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2]),
                                 weights=torch.tensor([0.5, 1.0])),
                            dict(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2]))),
    "other weights": (dict(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2]), weights=torch.tensor([0.5, 1.0])),
                      dict(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2]), weights=torch.tensor([0.5, 2.0]))),
    "within allclose": (dict(values=torch.tensor([1.0, 2.0]), lengths=torch.tensor([2])),
                        dict(values=torch.tensor([1.0, 2.0 + 1e-9]), lengths=torch.tensor([2]))),
    "empty": (dict(values=torch.tensor([]), lengths=torch.tensor([0, 0])),
              dict(values=torch.tensor([]), offsets=torch.tensor([0, 0, 0]))),
}


@pytest.mark.parametrize("case", sorted(JT_CASES))
def test_jt_is_equal_matches_torchrec(case):
    first, second = JT_CASES[case]
    expected = theirs.jt_is_equal(_jt(theirs, **first), _jt(theirs, **second))
    assert ours.jt_is_equal(_jt(ours, **first), _jt(ours, **second)) == expected
    assert ours.jt_is_equal(_jt(ours, **second), _jt(ours, **first)) == expected


def _kjt(module, keys, values, lengths, weights=None):
    return module.KeyedJaggedTensor.from_lengths_sync(keys, values, lengths, weights)


KJT_CASES = {
    "equal": ((["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0])),
              (["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0]))),
    "keys in another order": ((["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0])),
                              (["b", "a"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0]))),
    "other key": ((["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0])),
                  (["a", "c"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0]))),
    "same values, split otherwise": ((["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 0, 2, 0])),
                                     (["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1, 0]))),
    "other stride": ((["a"], torch.tensor([1, 2]), torch.tensor([1, 1])),
                     (["a"], torch.tensor([1, 2]), torch.tensor([1, 1, 0]))),
    "one key fewer": ((["a", "b"], torch.tensor([1, 2]), torch.tensor([1, 1])),
                      (["a"], torch.tensor([1, 2]), torch.tensor([2]))),
}


@pytest.mark.parametrize("case", sorted(KJT_CASES))
def test_kjt_is_equal_matches_torchrec(case):
    first, second = KJT_CASES[case]
    expected = theirs.kjt_is_equal(_kjt(theirs, *first), _kjt(theirs, *second))
    assert ours.kjt_is_equal(_kjt(ours, *first), _kjt(ours, *second)) == expected


def test_weighted_kjts_and_other_types():
    keys, values, lengths = ["a"], torch.tensor([1, 2]), torch.tensor([2])
    weighted = _kjt(ours, keys, values, lengths, torch.tensor([0.5, 1.0]))
    assert ours.kjt_is_equal(weighted, _kjt(ours, keys, values, lengths, torch.tensor([0.5, 1.0])))
    assert not ours.kjt_is_equal(weighted, _kjt(ours, keys, values, lengths))  # weights against none
    assert theirs.kjt_is_equal(_kjt(theirs, keys, values, lengths, torch.tensor([0.5, 1.0])),
                               _kjt(theirs, keys, values, lengths)) is False
    jt = _jt(ours, torch.tensor([1.0]), lengths=torch.tensor([1]))
    assert ours.jt_is_equal(jt, "not a jagged tensor") is False and ours.kjt_is_equal(jt, jt) is False
