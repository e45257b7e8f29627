"""Misuse of the jagged types raises what TorchRec's raises (AssertionError / IndexError, which TorchRec code may
catch) while staying a ValueError that names the fix. Every case is run against TorchRec 1.8 too."""

from __future__ import annotations

import pytest
import torch

import rectoolkit

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec


def kjt(lib, stride=2):
    return lib.KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(2 * stride), lengths=torch.ones(2 * stride, dtype=torch.int64))


CASES = {
    "kjt weights": (AssertionError, lambda lib: kjt(lib).weights()),
    "jt weights": (AssertionError, lambda lib: lib.JaggedTensor(values=torch.tensor([1]), lengths=torch.tensor([1])).weights()),
    "kjt inverse indices": (AssertionError, lambda lib: kjt(lib).inverse_indices()),
    "jt without lengths": (AssertionError, lambda lib: lib.JaggedTensor(values=torch.tensor([1, 2]))),
    "jt float lengths": (AssertionError, lambda lib: lib.JaggedTensor(values=torch.tensor([1, 2]),
                                                                      lengths=torch.tensor([1.0, 1.0]))),
    "concat strides": (AssertionError, lambda lib: lib.KeyedJaggedTensor.concat([kjt(lib, 3), kjt(lib, 1)])),
    "regroup_as_dict": (AssertionError, lambda lib: lib.KeyedTensor.regroup_as_dict(
        [lib.KeyedTensor(keys=["a", "b"], length_per_key=[1, 1], values=torch.ones(2, 2))], [["a"], ["b"]], ["x"])),
    "permute out of range": (IndexError, lambda lib: kjt(lib).permute([2])),
    "split past the keys": (IndexError, lambda lib: kjt(lib).split([1, 2])),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_misuse_raises_torchrecs_exception_type_and_a_value_error(case):
    kind, call = CASES[case]
    with pytest.raises(kind):
        call(torchrec)
    with pytest.raises(kind) as ours:
        call(rectoolkit)
    assert isinstance(ours.value, ValueError), type(ours.value)
