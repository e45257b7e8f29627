"""KeyedTensor regrouping against TorchRec 1.8 on the cases its kernels decide: inputs of different dtypes (every
group in the promoted dtype), empty groups (an empty block), and a key held by several KeyedTensors (the last one
for KeyedTensor.regroup, regroup_as_dict and KTRegroupAsDict; the first for regroup_kts and permute_multi_embedding)."""

import pytest
import torch

import rectoolkit.sparse as ours
from rectoolkit.modules.regroup import KTRegroupAsDict as OurRegroupModule
from rectoolkit.sparse.conversions import permute_multi_embedding as our_permute, regroup_kts as our_regroup_kts

torchrec = pytest.importorskip("torchrec")
theirs = torchrec.sparse.jagged_tensor

pytestmark = pytest.mark.torchrec


def _kts(lib, dtypes):
    """Two KeyedTensors sharing key "a" (widths 1 and 2), of the given dtypes, batch 3."""
    first = lib.KeyedTensor(keys=["a", "b"], length_per_key=[1, 2],
                            values=torch.arange(9.0).view(3, 3).to(dtypes[0]))
    second = lib.KeyedTensor(keys=["c", "a"], length_per_key=[2, 2],
                             values=(100 + torch.arange(12.0)).view(3, 4).to(dtypes[1]))
    return [first, second]


def _functions(lib):
    if lib is ours:
        regroup_kts, permute, module = our_regroup_kts, our_permute, OurRegroupModule
    else:
        from torchrec.modules.regroup import KTRegroupAsDict as module
        regroup_kts, permute = theirs.regroup_kts, theirs.permute_multi_embedding
    return {
        "regroup": lambda kts, groups: lib.KeyedTensor.regroup(kts, groups),
        "regroup_as_dict": lambda kts, groups: list(lib.KeyedTensor.regroup_as_dict(
            kts, groups, [f"g{i}" for i in range(len(groups))]).values()),
        "KTRegroupAsDict": lambda kts, groups: list(module(groups, [f"g{i}" for i in range(len(groups))])(kts).values()),
        "regroup_kts": regroup_kts,
        "permute_multi_embedding": permute,
    }


GROUPS = [[["a"], ["b", "c"]], [["c", "a", "b"], [], ["a"]], [["b"], ["a", "a"]]]
NAMES = ["regroup", "regroup_as_dict", "KTRegroupAsDict", "regroup_kts", "permute_multi_embedding"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("groups", GROUPS)
def test_a_key_in_two_keyed_tensors_and_empty_groups_as_torchrec(name, groups):
    dtypes = (torch.float32, torch.float32)
    mine = _functions(ours)[name](_kts(ours, dtypes), groups)
    reference = _functions(torchrec)[name](_kts(theirs, dtypes), groups)
    assert [t.shape for t in mine] == [t.shape for t in reference]
    for a, b in zip(mine, reference):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["regroup", "regroup_as_dict"])
@pytest.mark.parametrize("dtypes", [(torch.float16, torch.float32), (torch.float16, torch.bfloat16),
                                    (torch.float16, torch.float16), (torch.int64, torch.float32)])
def test_inputs_of_different_dtypes_regroup_to_the_promoted_dtype_as_torchrec(name, dtypes):
    groups = [["b"], ["c"], ["b", "c"]]
    mine = _functions(ours)[name](_kts(ours, dtypes), groups)
    reference = _functions(torchrec)[name](_kts(theirs, dtypes), groups)
    for a, b in zip(mine, reference):
        assert a.dtype == b.dtype == torch.promote_types(*dtypes)
        assert torch.equal(a, b)


def test_mixed_dtypes_stay_differentiable():
    half = ours.KeyedTensor(keys=["a"], length_per_key=[2], values=torch.ones(2, 2, dtype=torch.float16,
                                                                                requires_grad=True))
    full = ours.KeyedTensor(keys=["b"], length_per_key=[1], values=torch.ones(2, 1, requires_grad=True))
    (out,) = ours.KeyedTensor.regroup([half, full], [["a", "b"]])
    assert out.dtype == torch.float32
    (out * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert half.values().grad.dtype == torch.float16
    assert half.values().grad.tolist() == [[1.0, 2.0], [1.0, 2.0]]
    assert full.values().grad.tolist() == [[3.0], [3.0]]
