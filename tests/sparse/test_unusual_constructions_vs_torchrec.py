"""KeyedJaggedTensor constructions off the usual path, against TorchRec 1.8: 2-D lengths / offsets (TorchRec's
inference inputs, one row per key), narrow integer lengths, and what TorchRec accepts that needs no change."""

import pytest
import torch

import rectoolkit as rtk
import rectoolkit.sparse as ours

from helpers import assert_same_kjt

torchrec = pytest.importorskip("torchrec")
theirs = torchrec.sparse.jagged_tensor

pytestmark = pytest.mark.torchrec

VALUES = torch.tensor([1, 2, 3, 4, 5, 6])


def _both(**inputs):
    return ours.KeyedJaggedTensor(**inputs), theirs.KeyedJaggedTensor(**inputs)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("inputs", [
    {"keys": ["a", "b"], "lengths": torch.tensor([[1, 1], [2, 2]])},
    {"keys": ["a", "b", "c"], "lengths": torch.tensor([[1, 0], [2, 2], [0, 1]], dtype=torch.int32)},
    {"keys": ["a", "b"], "offsets": torch.tensor([[0, 1, 2], [2, 4, 6]])},
    {"keys": ["a", "b"], "lengths": torch.tensor([[1, 1, 2], [0, 2, 0]])},
])
def test_two_dimensional_lengths_and_offsets_are_read_key_major_as_torchrecs(inputs, weighted):
    weights = {"weights": torch.linspace(0.1, 0.6, 6)} if weighted else {}
    mine, reference = _both(values=VALUES, **inputs, **weights)
    flat = reference.flatten_lengths()  # TorchRec's own reading of them
    assert_same_kjt(mine, flat)
    assert mine.lengths().dim() == 1 and mine.offsets().dim() == 1  # (TorchRec keeps the 2-D tensors)
    mine_dict, reference_dict = mine.to_dict(), reference.to_dict()
    for key in reference.keys():
        assert torch.equal(mine_dict[key].values(), reference_dict[key].values())
        assert torch.equal(mine_dict[key].lengths(), reference_dict[key].lengths())
        assert torch.equal(mine[key].lengths(), flat[key].lengths())  # (TorchRec's kjt[key] on 2-D lengths is empty)
    assert_same_kjt(mine.permute([1, 0]), reference.permute([1, 0]))
    assert mine.length_per_key() == reference.length_per_key()


@pytest.mark.parametrize("module", ["EmbeddingBagCollection", "EmbeddingCollection"])
def test_the_collections_take_two_dimensional_lengths_as_torchrecs(module):
    def build(lib):
        torch.manual_seed(0)
        if module == "EmbeddingBagCollection":
            return lib.EmbeddingBagCollection(tables=[
                lib.EmbeddingBagConfig(name="t0", embedding_dim=2, num_embeddings=10, feature_names=["a"]),
                lib.EmbeddingBagConfig(name="t1", embedding_dim=3, num_embeddings=10, feature_names=["b"])])
        return lib.EmbeddingCollection(tables=[
            lib.EmbeddingConfig(name="t0", embedding_dim=2, num_embeddings=10, feature_names=["a", "b"])])

    inputs = {"keys": ["a", "b"], "values": VALUES, "lengths": torch.tensor([[1, 1], [2, 2]])}
    mine = build(rtk)(ours.KeyedJaggedTensor(**inputs))
    reference = build(torchrec)(theirs.KeyedJaggedTensor(**inputs))
    if module == "EmbeddingBagCollection":
        torch.testing.assert_close(mine.values(), reference.values(), rtol=0, atol=0)
    else:
        for key in reference:
            torch.testing.assert_close(mine[key].values(), reference[key].values(), rtol=0, atol=0)


def test_two_dimensional_offsets_whose_rows_do_not_chain_are_refused_by_row():
    # TorchRec reads these as lengths [1, 1, 1, 1] and fails later in split_with_sizes
    with pytest.raises(ValueError, match="row 1 starts at 3 but row 0 ends at 2"):
        ours.KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(5), offsets=torch.tensor([[0, 1, 2], [3, 4, 5]]))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16])
def test_narrow_integer_lengths_give_offsets_that_do_not_wrap_around(dtype):
    lengths = torch.tensor([100, 27, 100, 100], dtype=dtype)
    kjt = ours.KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(327), lengths=lengths)
    expected = [0, 100, 127, 227, 327]  # a hand sum; uint8 would wrap 327 to 71
    assert kjt.offsets().tolist() == expected and kjt.offsets().dtype == torch.int32
    assert kjt["b"].offsets().tolist() == [0, 100, 200]
    assert kjt.to_dict()["b"].offsets().tolist() == [0, 100, 200]
    # TorchRec's fbgemm cumsum refuses these dtypes; what it does compute agrees
    reference = theirs.KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(327), lengths=lengths)
    with pytest.raises(NotImplementedError):
        reference.offsets()
    assert kjt.length_per_key() == reference.length_per_key()
