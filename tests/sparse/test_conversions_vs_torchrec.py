"""TorchRec's jagged conversions and helpers against TorchRec 1.8 on the same inputs: ComputeKJTToJTDict,
ComputeJTDictToKJT, regroup_kts, KTRegroupAsDict, validate_keyed_jagged_tensor, JaggedTensor.empty_like / copy_,
KeyedJaggedTensor.copy_, and KeyedTensor as a torch.utils._pytree node."""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

import rectoolkit as rtk
from rectoolkit.modules.regroup import KTRegroupAsDict
from rectoolkit.sparse.conversions import ComputeJTDictToKJT, ComputeKJTToJTDict, permute_multi_embedding, regroup_kts
from rectoolkit.sparse.jagged_tensor_validator import validate_keyed_jagged_tensor
from rectoolkit.sparse.validation import validation_disabled

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

KJT_INPUTS = [  # (keys, values, lengths, weights)
    (["a", "b"], [1, 2, 3, 4, 5], [2, 0, 1, 2], None),
    (["a", "b", "c"], [7, 8, 9], [0, 1, 0, 2, 0, 0], [0.5, 1.5, 2.5]),
    (["x"], [], [0, 0, 0], None),
]


def _kjt(lib, keys, values, lengths, weights, **kwargs):
    return lib.KeyedJaggedTensor(keys=keys, values=torch.tensor(values, dtype=torch.int64),
                                 lengths=torch.tensor(lengths, dtype=torch.int32),
                                 weights=torch.tensor(weights) if weights is not None else None, **kwargs)


def _jt_fields(jt):
    weights = jt.weights_or_none()
    return jt.values().tolist(), jt.lengths().tolist(), jt.offsets().tolist(), None if weights is None else weights.tolist()


@pytest.mark.parametrize("inputs", KJT_INPUTS)
def test_kjt_to_jt_dict_and_back(inputs):
    from torchrec.sparse import jagged_tensor as theirs

    mine = ComputeKJTToJTDict()(_kjt(rtk, *inputs))
    expected = theirs.ComputeKJTToJTDict()(_kjt(torchrec, *inputs))
    assert list(mine) == list(expected)
    assert {k: _jt_fields(v) for k, v in mine.items()} == {k: _jt_fields(v) for k, v in expected.items()}
    back, their_back = ComputeJTDictToKJT()(mine), theirs.ComputeJTDictToKJT()(expected)
    assert back.keys() == their_back.keys() and back.stride() == their_back.stride()
    assert back.values().tolist() == their_back.values().tolist()
    assert back.lengths().tolist() == their_back.lengths().tolist()
    assert (back.weights_or_none() is None) == (their_back.weights_or_none() is None)


def _kts(lib):
    g = torch.Generator().manual_seed(0)
    return [lib.KeyedTensor.from_tensor_list(["f1", "f2"], [torch.randn(3, 2, generator=g), torch.randn(3, 4, generator=g)]),
            lib.KeyedTensor.from_tensor_list(["f3", "f4", "f5"], [torch.randn(3, 1, generator=g) for _ in range(3)])]


@pytest.mark.parametrize("groups", [[["f1", "f3"], ["f2"]], [["f5", "f1", "f4"]], [["f2"], ["f2", "f3"], ["f4", "f5"]]])
def test_regroup_kts_and_kt_regroup_as_dict(groups):
    from torchrec.modules.regroup import KTRegroupAsDict as TorchRecRegroup
    from torchrec.sparse.jagged_tensor import regroup_kts as their_regroup_kts

    expected = their_regroup_kts(_kts(torchrec), groups)
    mine = regroup_kts(_kts(rtk), groups)
    assert len(mine) == len(expected)
    for got, want in zip(mine, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    keys = [f"g{i}" for i in range(len(groups))]
    if len({k for group in groups for k in group}) == sum(len(group) for group in groups):  # TorchRec's module: no repeats
        their_dict = TorchRecRegroup(groups, keys)(_kts(torchrec))
        my_dict = KTRegroupAsDict(groups, keys)(_kts(rtk))
        assert list(my_dict) == list(their_dict)
        for key in keys:
            torch.testing.assert_close(my_dict[key], their_dict[key], rtol=0, atol=0)


@pytest.mark.parametrize("groups", [[["f1", "f3"], ["f2"]], [["f2"], ["f2", "f3"], ["f4", "f5", "f1"]]])
def test_permute_multi_embedding_values_equal_torchrecs_and_gradients_route_back(groups):
    """Values against TorchRec's permute_multi_embedding; gradients against a hand sum (fbgemm's CPU backward, of
    permute_multi_embedding and of regroup_kts, leaves the gradient of keys in no group uninitialized: 9e-41, 9e19
    where 0 is right)."""
    from torchrec.sparse.jagged_tensor import permute_multi_embedding as theirs

    kts = _kts(rtk)
    for kt in kts:
        kt.values().requires_grad_(True)
    out = permute_multi_embedding(kts, groups)
    for got, want in zip(out, theirs(_kts(torchrec), groups)):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=0)
    weights = [torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape) for t in out]
    sum((t * w).sum() for t, w in zip(out, weights)).backward()
    expected = {kt_index: torch.zeros_like(kt.values()) for kt_index, kt in enumerate(kts)}
    where = {key: (i, kt.offset_per_key()[j], kt.length_per_key()[j])
             for i, kt in enumerate(kts) for j, key in enumerate(kt.keys())}
    for group, weight in zip(groups, weights):
        column = 0
        for key in group:
            i, start, width = where[key]
            expected[i][:, start:start + width] += weight[:, column:column + width]
            column += width
    for i, kt in enumerate(kts):
        torch.testing.assert_close(kt.values().grad, expected[i], rtol=0, atol=0)
    assert rtk.sparse.jagged_tensor.permute_multi_embedding is permute_multi_embedding


def test_kt_regroup_refuses_what_it_does_not_do():
    with pytest.raises(ValueError, match="2 groups but 1 keys"):
        KTRegroupAsDict([["a"], ["b"]], ["x"])
    with pytest.raises(ValueError, match="packed torch.quint4x2"):
        KTRegroupAsDict([["a"]], ["x"], emb_dtype=rtk.DataType.INT4)
    with pytest.raises(ValueError, match="'FP12'.*not a DataType"):
        KTRegroupAsDict([["a"]], ["x"], emb_dtype="FP12")


@pytest.mark.parametrize("emb_dtype", ["FP32", "FP16", "BF16"])  # INT8: fbgemm's CPU permute has no int8 kernel
def test_kt_regroup_as_dict_casts_to_emb_dtype_as_torchrec(emb_dtype):
    from torchrec.modules.embedding_configs import DataType as TheirDataType
    from torchrec.modules.regroup import KTRegroupAsDict as TorchRecRegroup

    groups, keys = [["f1", "f3"], ["f2", "f5"]], ["x", "y"]
    kts = [lambda lib: [lib.KeyedTensor(kt.keys(), kt.length_per_key(), 4 * kt.values()) for kt in _kts(lib)]][0]
    theirs = TorchRecRegroup(groups, keys, emb_dtype=TheirDataType[emb_dtype], multi_device=True)(kts(torchrec))
    for given in (rtk.DataType[emb_dtype], TheirDataType[emb_dtype], emb_dtype):  # either enum, or the name
        mine = KTRegroupAsDict(groups, keys, emb_dtype=given, multi_device=True)(kts(rtk))
        assert list(mine) == list(theirs)
        for key in keys:
            assert mine[key].dtype == theirs[key].dtype, (given, key)
            torch.testing.assert_close(mine[key], theirs[key], rtol=0, atol=0)
    whole = KTRegroupAsDict(groups, keys)(kts(rtk))
    cast = KTRegroupAsDict(groups, keys, emb_dtype="INT8")(kts(rtk))
    assert all(torch.equal(cast[key], whole[key].to(torch.int8)) for key in keys)


VALIDATOR_CASES = [  # (keys, values, lengths, offsets, weights)
    (["a", "b"], [1, 2, 3], [2, 0, 1, 0], None, None),  # valid
    (["a", "b"], [1, 2, 3, 4], [2, 0, 1, 0], None, None),  # a padded batch: more values than lengths sum
    (["a", "b"], [1, 2, 3], None, [0, 2, 2, 3, 3], [0.1, 0.2, 0.3]),  # offsets, weighted
    (["a", "b"], [1, 2, 3], None, [1, 2, 2, 3, 3], None),  # offsets not from 0
    (["a", "b"], [1, 2, 3], [2, 0, 1, 0], [0, 2, 2, 2, 3], None),  # lengths and offsets disagree
    (["a", "a"], [1, 2, 3], [2, 0, 1, 0], None, None),  # repeated key
    (["a", "b"], [1, 2, 3], [2, 0, 1], None, None),  # lengths not divisible by keys
    (["a"], [1, 2], [2], None, [0.5]),  # weights shorter than values
]


def _raw_kjt(lib, keys, values, lengths, offsets, weights):
    as_int = lambda v: None if v is None else torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return lib.KeyedJaggedTensor(keys=keys, values=as_int(values), lengths=as_int(lengths), offsets=as_int(offsets),
                                 weights=None if weights is None else torch.tensor(weights))


def _outcome(validate, kjt, configs=None):
    try:
        return validate(kjt, configs)
    except ValueError as error:
        return f"ValueError: {error}"


@pytest.mark.parametrize("case", VALIDATOR_CASES, ids=range(len(VALIDATOR_CASES)))
def test_validator_agrees_with_torchrecs(case):
    from torchrec.sparse.jagged_tensor_validator import validate_keyed_jagged_tensor as theirs

    with validation_disabled():
        mine = _raw_kjt(rtk, *case)
    assert _outcome(validate_keyed_jagged_tensor, mine) == _outcome(theirs, _raw_kjt(torchrec, *case))


def test_validator_reports_ids_out_of_range_as_torchrecs():
    from torchrec.sparse.jagged_tensor_validator import validate_keyed_jagged_tensor as theirs

    def configs(lib):
        return [lib.EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=3, feature_names=["a", "b"])]

    for values, expected in (([0, 2, 1], True), ([0, 3, 1], False), ([0, 2, -1], False)):
        case = (["a", "b"], values, [2, 0, 1, 0], None, None)
        with validation_disabled():
            mine = _raw_kjt(rtk, *case)
        assert _outcome(validate_keyed_jagged_tensor, mine, configs(rtk)) == \
            _outcome(theirs, _raw_kjt(torchrec, *case), configs(torchrec)) == expected


@pytest.mark.parametrize("device", [None, "cpu"])
def test_empty_like_and_copy_(device):
    for lib in (rtk, torchrec):
        jt = lib.JaggedTensor(values=torch.tensor([1.0, 2.0, 3.0]), lengths=torch.tensor([2, 1]),
                              weights=torch.tensor([0.1, 0.2, 0.3]))
        empty = lib.JaggedTensor.empty_like(jt, device=torch.device(device) if device else None)
        shapes = (empty.values().shape, empty.weights().shape, empty.lengths().shape, empty.values().dtype)
        if lib is rtk:
            mine = shapes
        else:
            assert mine == shapes
    source_inputs = KJT_INPUTS[1]
    results = []
    for lib in (rtk, torchrec):
        source = _kjt(lib, *source_inputs)
        target = lib.KeyedJaggedTensor.empty_like(source, device=torch.device("cpu"))
        copied = target.copy_(source)
        assert copied is target
        results.append((copied.keys(), copied.values().tolist(), copied.lengths().tolist(), copied.weights().tolist(),
                        copied.length_per_key(), copied.stride()))
        jt_target = lib.JaggedTensor.empty_like(source["b"], device=torch.device("cpu")).copy_(source["b"])
        results.append(_jt_fields(jt_target))
    assert results[:2] == results[2:]


def test_keyed_tensor_is_a_pytree_node_like_torchrecs():
    for lib in (rtk, torchrec):
        kt = lib.KeyedTensor.from_tensor_list(["u", "v"], [torch.ones(2, 3), torch.zeros(2, 1)])
        leaves, spec = pytree.tree_flatten({"out": kt})
        assert len(leaves) == 1 and leaves[0] is kt.values()
        doubled = pytree.tree_map(lambda t: t * 2, {"out": kt})["out"]
        assert type(doubled) is type(kt) and doubled.keys() == ["u", "v"] and doubled.length_per_key() == [3, 1]
        torch.testing.assert_close(doubled["u"], torch.full((2, 3), 2.0))
        again = pytree.tree_unflatten(leaves, spec)["out"]
        assert again.keys() == kt.keys() and again.values() is kt.values()
