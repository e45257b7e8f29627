"""JaggedTensor and KeyedJaggedTensor as torch.utils._pytree nodes, against TorchRec 1.8 on the same objects:
the same leaves (None where a field is absent), the same key paths and context, round trips, tree_map, the
torch.fx flatten spec, and torch.export of a function that takes a KJT."""

from __future__ import annotations

import pytest
import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree

import rectoolkit as rtk

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec


def _same_leaves(ours, theirs):
    assert len(ours) == len(theirs)
    for position, (a, b) in enumerate(zip(ours, theirs)):
        assert (a is None) == (b is None), f"leaf {position}: {a!r} vs {b!r}"
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b), f"leaf {position}: {a!r} vs {b!r}"


def _jts(lib):
    values = torch.tensor([1.0, 2.0, 3.0])
    return [lib.JaggedTensor(values=values, lengths=torch.tensor([2, 0, 1])),
            lib.JaggedTensor(values=values, weights=torch.tensor([0.5, 1.0, 2.0]), offsets=torch.tensor([0, 1, 3])),
            lib.JaggedTensor(values=values, lengths=torch.tensor([1, 2]), offsets=torch.tensor([0, 1, 3]))]


def _kjts(lib):
    keys = ["a", "b"]
    values = torch.tensor([5, 6, 7, 8])
    return [lib.KeyedJaggedTensor(keys, values, lengths=torch.tensor([1, 0, 2, 1])),
            lib.KeyedJaggedTensor(keys, values, weights=torch.tensor([0.1, 0.2, 0.3, 0.4]),
                                  offsets=torch.tensor([0, 1, 1, 3, 4])),
            # a batch size per key and rank (VBE), with the inverse indices that expand it back
            lib.KeyedJaggedTensor(keys, values, lengths=torch.tensor([1, 2, 1]), stride_per_key_per_rank=[[1], [2]],
                                  inverse_indices=(keys, torch.tensor([[0, 0, 0], [0, 1, 1]])))]


@pytest.mark.parametrize("make", [_jts, _kjts], ids=["JaggedTensor", "KeyedJaggedTensor"])
def test_leaves_paths_and_context_are_torchrecs(make):
    for ours, theirs in zip(make(rtk), make(torchrec)):
        our_leaves, our_spec = pytree.tree_flatten(ours)
        their_leaves, their_spec = pytree.tree_flatten(theirs)
        _same_leaves(our_leaves, their_leaves)
        assert our_spec.context == their_spec.context
        our_paths = [path for path, _ in pytree.tree_flatten_with_path(ours)[0]]
        assert our_paths == [path for path, _ in pytree.tree_flatten_with_path(theirs)[0]]
        _same_leaves(fx_pytree.tree_flatten_spec(ours, our_spec), fx_pytree.tree_flatten_spec(theirs, their_spec))


def test_round_trip_rebuilds_the_same_objects():
    for jt in _jts(rtk):
        again = pytree.tree_unflatten(*pytree.tree_flatten({"x": [jt]}))["x"][0]
        assert type(again) is rtk.JaggedTensor
        assert torch.equal(again.values(), jt.values()) and torch.equal(again.lengths(), jt.lengths())
        assert torch.equal(again.offsets(), jt.offsets())
        _same_leaves([again.weights_or_none()], [jt.weights_or_none()])
    for kjt in _kjts(rtk):
        again = pytree.tree_unflatten(*pytree.tree_flatten((kjt, 1)))[0]
        assert type(again) is rtk.KeyedJaggedTensor and again.keys() == kjt.keys()
        assert torch.equal(again.values(), kjt.values()) and torch.equal(again.lengths(), kjt.lengths())
        assert again.stride_per_key() == kjt.stride_per_key()
        assert again.stride_per_key_per_rank() == kjt.stride_per_key_per_rank()
        _same_leaves([again.weights_or_none()], [kjt.weights_or_none()])
        inverse, expected = again.inverse_indices_or_none(), kjt.inverse_indices_or_none()
        assert (inverse is None) == (expected is None)
        if expected is not None:
            assert inverse[0] == expected[0] and torch.equal(inverse[1], expected[1])
        assert [jt.values().tolist() for jt in again.to_dict().values()] == \
            [jt.values().tolist() for jt in kjt.to_dict().values()]


def test_tree_map_over_a_kjt_matches_torchrec():
    def to_int32(leaf):
        return None if leaf is None or leaf.is_floating_point() else leaf.to(torch.int32)

    for ours, theirs in zip(_kjts(rtk)[:2], _kjts(torchrec)[:2]):
        mapped, their_mapped = pytree.tree_map(to_int32, {"f": ours}), pytree.tree_map(to_int32, {"f": theirs})
        assert type(mapped["f"]) is rtk.KeyedJaggedTensor and mapped["f"].values().dtype == torch.int32
        assert mapped["f"].weights_or_none() is None  # mapped to None like every floating leaf
        _same_leaves(pytree.tree_leaves(mapped), pytree.tree_leaves(their_mapped))
        # the mapped KJT still reads per key as the original (a hand-checked split of the same values)
        assert mapped["f"]["b"].values().tolist() == ours["b"].values().tolist()


def test_export_of_a_function_taking_a_kjt():
    class Rescale(torch.nn.Module):
        def forward(self, kjt):
            return rtk.KeyedJaggedTensor(kjt.keys(), kjt.values() * 10, lengths=kjt.lengths()), kjt.lengths().sum()

    kjt = rtk.KeyedJaggedTensor(["a", "b"], torch.tensor([5, 6, 7, 8]), lengths=torch.tensor([1, 0, 2, 1]))
    program = torch.export.export(Rescale(), (kjt,), strict=False)
    other = rtk.KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3, 4]), lengths=torch.tensor([2, 1, 0, 1]))
    rescaled, total = program.module()(other)
    assert type(rescaled) is rtk.KeyedJaggedTensor and rescaled.keys() == ["a", "b"]
    assert rescaled.values().tolist() == [10, 20, 30, 40] and rescaled.lengths().tolist() == [2, 1, 0, 1]
    assert int(total) == 4


def test_kjt_list_flattens_like_torchrec_and_back():
    from torchrec.sparse.jagged_tensor import flatten_kjt_list as theirs_flatten

    from rectoolkit.sparse.jagged_tensor import flatten_kjt_list, kjt_is_equal, unflatten_kjt_list

    assert rtk.KeyedJaggedTensor._fields == torchrec.KeyedJaggedTensor._fields
    assert rtk.JaggedTensor._fields == torchrec.JaggedTensor._fields
    ours, theirs = _kjts(rtk), _kjts(torchrec)
    our_leaves, our_keys = flatten_kjt_list(ours)
    their_leaves, their_keys = theirs_flatten(theirs)
    _same_leaves(our_leaves, their_leaves)
    assert our_keys == their_keys
    for rebuilt, original in zip(unflatten_kjt_list(our_leaves, our_keys), ours, strict=True):
        assert kjt_is_equal(rebuilt, original)
    with pytest.raises(ValueError, match="5 leaves for 1 KJTs; each KJT has 6"):
        unflatten_kjt_list(our_leaves[:5], our_keys[:1])
