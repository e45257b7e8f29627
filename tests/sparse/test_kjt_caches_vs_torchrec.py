"""The *_or_none accessors of KeyedJaggedTensor against TorchRec's: what is cached after each call.

TorchRec computes length_per_key / offset_per_key only when asked, so length_per_key_or_none() is None on a fresh
KJT; rectoolkit's validation sums the lengths per key while checking them, and must not show that cache early.
"""

import pytest
import torch

import rectoolkit.sparse as ours

torchrec = pytest.importorskip("torchrec")
theirs = torchrec.sparse.jagged_tensor

pytestmark = pytest.mark.torchrec

VALUES = torch.tensor([1, 2, 3, 4])
LENGTHS = torch.tensor([1, 1, 2, 0])
OFFSETS = torch.tensor([0, 1, 2, 4, 4])


def _fresh(lib):
    return lib.KeyedJaggedTensor(keys=["a", "b"], values=VALUES, lengths=LENGTHS)


def _variable(lib):
    return lib.KeyedJaggedTensor(keys=["a", "b"], values=VALUES, lengths=torch.tensor([1, 1, 2]),
                                 stride_per_key_per_rank=[[1], [2]])


SCENARIOS = {
    "fresh": _fresh,
    "from offsets": lambda lib: lib.KeyedJaggedTensor(keys=["a", "b"], values=VALUES, offsets=OFFSETS),
    "variable batch": _variable,
    "after length_per_key": lambda lib: (lambda k: (k.length_per_key(), k)[1])(_fresh(lib)),
    "after offset_per_key": lambda lib: (lambda k: (k.offset_per_key(), k)[1])(_fresh(lib)),
    "after getitem": lambda lib: (lambda k: (k["b"], k)[1])(_fresh(lib)),
    "after sync, unsync": lambda lib: _fresh(lib).sync().unsync(),
    "from_lengths_sync": lambda lib: lib.KeyedJaggedTensor.from_lengths_sync(["a", "b"], VALUES, LENGTHS),
    "to": lambda lib: _fresh(lib).to("cpu"),
    "concat of fresh": lambda lib: lib.KeyedJaggedTensor.concat([_fresh(lib), _fresh(lib)]),
    "concat of one synced": lambda lib: lib.KeyedJaggedTensor.concat([_fresh(lib).sync(), _fresh(lib)]),
    "concat of synced": lambda lib: lib.KeyedJaggedTensor.concat([_fresh(lib).sync(), _fresh(lib).sync()]),
    "concat variable": lambda lib: lib.KeyedJaggedTensor.concat([_variable(lib), _variable(lib)]),
    "permute": lambda lib: _fresh(lib).permute([1, 0]),
    "split": lambda lib: _fresh(lib).split([1, 1])[1],
    "flatten_lengths": lambda lib: _fresh(lib).flatten_lengths(),
}


def _caches(kjt):
    tensors = [kjt.lengths_or_none(), kjt.offsets_or_none(), kjt.weights_or_none()]
    return (kjt.length_per_key_or_none(), kjt.offset_per_key_or_none(),
            [None if t is None else t.tolist() for t in tensors], kjt.inverse_indices_or_none())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_or_none_accessors_show_what_torchrec_has_computed(name):
    build = SCENARIOS[name]
    assert _caches(build(ours)) == _caches(build(theirs))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_values_once_computed_equal_torchrecs(name):
    mine, reference = SCENARIOS[name](ours), SCENARIOS[name](theirs)
    assert mine.length_per_key() == reference.length_per_key()
    assert mine.offset_per_key() == reference.offset_per_key()
    assert _caches(mine) == _caches(reference)


def test_concat_leaves_its_inputs_caches_alone():
    mine, reference = _fresh(ours), _fresh(theirs)
    ours.KeyedJaggedTensor.concat([mine, _fresh(ours)])
    theirs.KeyedJaggedTensor.concat([reference, _fresh(theirs)])
    assert mine.length_per_key_or_none() is None and reference.length_per_key_or_none() is None
