"""rectoolkit.modules.utils against TorchRec 1.8's torchrec.modules.utils on the same inputs."""

from __future__ import annotations

import doctest

import pytest
import torch
from torch import nn

import rectoolkit as rtk
import rectoolkit.modules.utils as ours

theirs = pytest.importorskip("torchrec.modules.utils")
pytest.importorskip("fbgemm_gpu")
pytestmark = pytest.mark.torchrec

import torchrec  # noqa: E402


def test_docstring_examples():
    assert doctest.testmod(ours).failed == 0


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as error:  # the same failure on both sides is what is compared
        return ("error", type(error).__name__, str(error))


def _factory():
    return nn.Linear(2, 3)


def _tensor_fn(x):
    return x * 2


class _TakesInput(nn.Module):
    def forward(self, x):
        return x


@pytest.mark.parametrize("given", ["factory", "tensor_fn", "module", "lambda_int", "raises_type_error"])
def test_extract_module_or_tensor_callable(given):
    def raises_type_error():
        raise TypeError("something else")

    value = {"factory": _factory, "tensor_fn": _tensor_fn, "module": _TakesInput(), "lambda_int": lambda: 3,
             "raises_type_error": raises_type_error}[given]
    mine = _outcome(ours.extract_module_or_tensor_callable, value)
    reference = _outcome(theirs.extract_module_or_tensor_callable, value)
    assert mine[0] == reference[0]
    if mine[0] == "error":
        assert mine == reference
    elif given == "factory":
        assert type(mine[1]) is type(reference[1]) is nn.Linear
    else:
        assert mine[1] is reference[1] is value


@pytest.mark.parametrize("module", [nn.Linear(4, 3), nn.Sequential(nn.Linear(4, 5), nn.ReLU()), _tensor_fn,
                                    nn.ModuleList([nn.Linear(4, 3), nn.Linear(4, 3)]),
                                    [nn.Linear(4, 3), nn.ModuleList([nn.Linear(4, 3), nn.Linear(4, 2)])]])
def test_module_output_dimension(module):
    if not isinstance(module, (list, nn.ModuleList)):
        assert ours.get_module_output_dimension(module, 4) == theirs.get_module_output_dimension(module, 4)
    for out_features in (2, 3, 4, 5):
        assert ours.check_module_output_dimension(module, 4, out_features) == \
            theirs.check_module_output_dimension(module, 4, out_features)


@pytest.mark.parametrize("sizes", [(3,), (2, 3), (2, 1, 2)])
def test_construct_modulelist_from_single_module(sizes):
    built = []
    for lib in (ours, theirs):
        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
        torch.manual_seed(1)
        built.append(lib.construct_modulelist_from_single_module(module, sizes))
    assert str(built[0]) == str(built[1])
    mine, reference = built[0].state_dict(), built[1].state_dict()
    assert list(mine) == list(reference)
    for name in mine:
        torch.testing.assert_close(mine[name], reference[name])


def test_init_mlp_weights_xavier_uniform():
    modules = []
    for lib in (ours, theirs):
        torch.manual_seed(0)
        module = nn.Sequential(nn.Linear(3, 2), nn.Conv1d(1, 1, 2))
        torch.manual_seed(5)
        module.apply(lib.init_mlp_weights_xavier_uniform)
        modules.append(module.state_dict())
    for name in modules[0]:
        torch.testing.assert_close(modules[0][name], modules[1][name])


@pytest.mark.parametrize("sizes,shape", [((2,), [2]), ((2, 3), [3, 3]), ((2, 2), [2, 2]), ((3,), [2])])
def test_convert_list_of_modules_to_modulelist(sizes, shape):
    def nested(level):
        if level == len(shape) - 1:
            return [nn.Linear(1, 1) for _ in range(shape[level])]
        return [nested(level + 1) for _ in range(shape[level])]

    modules = nested(0)
    mine = _outcome(ours.convert_list_of_modules_to_modulelist, modules, sizes)
    reference = _outcome(theirs.convert_list_of_modules_to_modulelist, modules, sizes)
    assert mine[0] == reference[0]
    if mine[0] == "ok":
        assert str(mine[1]) == str(reference[1])
        assert [id(m) for m in mine[1].modules() if isinstance(m, nn.Linear)] == \
            [id(m) for m in reference[1].modules() if isinstance(m, nn.Linear)]
    else:
        assert mine == reference


def _assert_same_jts(mine, reference):
    assert list(mine) == list(reference)
    for key in mine:
        assert torch.equal(mine[key].values(), reference[key].values()), key
        assert torch.equal(mine[key].lengths(), reference[key].lengths()), key
        assert (mine[key].weights_or_none() is None) == (reference[key].weights_or_none() is None), key
        if mine[key].weights_or_none() is not None:
            assert torch.equal(mine[key].weights(), reference[key].weights()), key


KEYS = ["a", "b", "c"]
LENGTHS = torch.tensor([1, 0, 2, 3, 1, 0, 2, 1, 1])  # 3 keys x batch 3
VALUES = torch.arange(11) * 3


@pytest.mark.parametrize("need_indices", [False, True])
@pytest.mark.parametrize("names,permute", [
    (["a", "b", "c"], None), (["x", "y", "x"], None), (["x", "y", "x"], {"x": [1, 0]}), (["x", "x", "x"], {"x": [2, 0, 1]})])
@pytest.mark.parametrize("dedup", [None, "index_select", "gather"])
def test_construct_jagged_tensors(need_indices, names, permute, dedup):
    # a name given more than once is one feature's column blocks: the same lengths
    lengths = LENGTHS if len(set(names)) == 3 else torch.tensor([1, 0, 2] * 3)
    total = int(lengths.sum())
    torch.manual_seed(0)
    rows = torch.randn(total, 4)
    reverse = None
    if dedup is not None:
        rows, reverse = torch.randn(6, 4), torch.randint(0, 6, (total,))
    results = []
    for lib, module in ((rtk, ours), (torchrec, theirs)):
        features = lib.KeyedJaggedTensor(keys=KEYS, values=VALUES[:total], lengths=lengths)
        results.append(module.construct_jagged_tensors(
            rows, features, names, need_indices=need_indices, features_to_permute_indices=permute,
            reverse_indices=reverse, use_gather_select=dedup == "gather"))
    _assert_same_jts(*results)


def test_construct_jagged_tensors_original_features_and_vbe_context():
    torch.manual_seed(0)
    rows = torch.randn(11, 2)
    # two features, their segments (rank blocks) reordered by recat
    unpadded = torch.tensor([3, 2, 4, 2], dtype=torch.int32)  # int32, as fbgemm takes them
    recat = torch.tensor([2, 0, 3, 1], dtype=torch.int32)
    reindexed_lengths = torch.tensor([[2, 2], [1, 2], [1, 0], [2, 1]]).view(2, 4)
    results = []
    for lib, module in ((rtk, ours), (torchrec, theirs)):
        ignored = lib.KeyedJaggedTensor(keys=["q"], values=torch.tensor([1]), lengths=torch.tensor([1]))
        original = lib.KeyedJaggedTensor(keys=KEYS, values=VALUES, lengths=LENGTHS)
        results.append(module.construct_jagged_tensors(rows, ignored, KEYS, original_features=original))
        context = module.SequenceVBEContext(recat=recat, unpadded_lengths=unpadded,
                                            reindexed_lengths=reindexed_lengths, reindexed_length_per_key=[7, 4],
                                            reindexed_values=torch.arange(11))
        results.append(module.construct_jagged_tensors(rows, ignored, ["f", "g"], need_indices=True,
                                                       seq_vbe_ctx=context))
    _assert_same_jts(results[0], results[2])
    _assert_same_jts(results[1], results[3])


@pytest.mark.parametrize("need_indices", [False, True])
@pytest.mark.parametrize("mode", ["plain", "reverse", "remove_padding"])
def test_construct_jagged_tensors_inference(need_indices, mode):
    torch.manual_seed(0)
    lengths = torch.tensor([[1, 0, 2], [3, 1, 0], [1, 0, 2]])  # x twice (two column blocks): the same lengths
    rows = torch.randn(14, 3) if mode == "remove_padding" else torch.randn(10, 3)
    reverse = torch.randint(0, 10, (10,)) if mode == "reverse" else None
    results = [module.construct_jagged_tensors_inference(
        rows, lengths, VALUES[:10], ["x", "y", "x"], need_indices=need_indices, features_to_permute_indices={"x": [1, 0]},
        reverse_indices=reverse, remove_padding=mode == "remove_padding") for module in (ours, theirs)]
    _assert_same_jts(*results)


@pytest.mark.parametrize("ids", [[2, 0], [1, 1, 2], [0], [], [2, 1, 0]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_jagged_index_select_with_empty(ids, dtype):
    values = (torch.arange(10) * 7).to(dtype)
    offsets = torch.tensor([3, 5, 10], dtype=torch.int32)  # segments [0:3], [3:5], [5:10]
    segment_lengths = torch.tensor([3, 2, 5])
    ids = torch.tensor(ids, dtype=torch.int64)
    output_offsets = torch.cumsum(segment_lengths[ids], 0)
    mine = ours.jagged_index_select_with_empty(values, ids, offsets, output_offsets)
    reference = theirs.jagged_index_select_with_empty(values, ids, offsets, output_offsets)
    assert mine.shape == reference.shape and mine.dtype == reference.dtype and torch.equal(mine, reference)


@pytest.mark.parametrize("ids", [[5, 3, 5, 3, 9], [1], [4, 4, 4, 4], [7, 2, 9, 2, 7, 7, 0]])
def test_deterministic_dedup(ids):
    ids = torch.tensor(ids)
    for mine, reference in zip(ours.deterministic_dedup(ids), theirs.deterministic_dedup(ids)):
        assert torch.equal(mine, reference)


def test_sequence_vbe_context_fields():
    import dataclasses

    assert [(f.name, f.default) for f in dataclasses.fields(ours.SequenceVBEContext)] == \
        [(f.name, f.default) for f in dataclasses.fields(theirs.SequenceVBEContext)]
    assert issubclass(ours.SequenceVBEContext, rtk.streamable.Multistreamable)
