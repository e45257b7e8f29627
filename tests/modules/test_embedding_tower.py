"""EmbeddingTower / EmbeddingTowerCollection against TorchRec 1.8: same state_dict keys, same outputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import rectoolkit as rtk
import rectoolkit.modules.embedding_tower as ours_module
from rectoolkit.modules.embedding_tower import EmbeddingTower, EmbeddingTowerCollection

torchrec = pytest.importorskip("torchrec")
from torchrec.modules import embedding_tower as theirs  # noqa: E402

pytestmark = pytest.mark.torchrec


class PooledLinear(nn.Module):
    """Interaction of a bag collection: a linear layer over the pooled KeyedTensor."""

    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, out)

    def forward(self, pooled) -> torch.Tensor:
        return self.linear(pooled.values())


class SequenceSum(nn.Module):
    """Interaction of a sequence collection: each feature's rows summed per sample, side by side."""

    def forward(self, jts) -> torch.Tensor:
        return torch.cat([torch.segment_reduce(jts[k].values(), "sum", lengths=jts[k].lengths(), axis=0)
                          for k in sorted(jts)], dim=1)


def _towers(lib, tower_module, collection_module):
    torch.manual_seed(0)
    bag = lib.EmbeddingBagCollection(tables=[lib.EmbeddingBagConfig(
        name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"])])
    weighted = lib.EmbeddingBagCollection(tables=[lib.EmbeddingBagConfig(
        name="t_item", num_embeddings=20, embedding_dim=4, feature_names=["item"])], is_weighted=True)
    seq = lib.EmbeddingCollection(tables=[lib.EmbeddingConfig(
        name="t_seq", num_embeddings=20, embedding_dim=4, feature_names=["item"])])
    towers = [tower_module.EmbeddingTower(bag, PooledLinear(4, 3)),
              tower_module.EmbeddingTower(weighted, PooledLinear(4, 2)),
              tower_module.EmbeddingTower(seq, SequenceSum())]
    return collection_module(towers)


def _features(lib, weighted):
    return lib.KeyedJaggedTensor(keys=["user", "item"], values=torch.tensor([1, 2, 9, 3, 4, 5, 19]),
                                 lengths=torch.tensor([2, 0, 1, 1, 3, 0]),
                                 weights=torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25, 3.0, 1.0]) if weighted else None)


def test_tower_collection_equals_torchrec():
    ours = _towers(rtk, ours_module, EmbeddingTowerCollection)
    ref = _towers(torchrec, theirs, theirs.EmbeddingTowerCollection)
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    got = ours(_features(rtk, False), _features(rtk, True))
    want = ref(_features(torchrec, False), _features(torchrec, True))
    assert got.shape == (3, 3 + 2 + 4)
    torch.testing.assert_close(got, want)
    tower = EmbeddingTower(ours.towers[0].embedding, ours.towers[0].interaction)
    torch.testing.assert_close(tower(_features(rtk, False)), ref.towers[0](_features(torchrec, False)))


def test_missing_input_and_wrong_device_are_refused():
    ours = _towers(rtk, ours_module, EmbeddingTowerCollection)
    with pytest.raises(ValueError, match=r"tower 1 \(EmbeddingBagCollection\) reads weighted_features, which was not given"):
        ours(_features(rtk, False))
    with pytest.raises(ValueError, match=r"EmbeddingTower\(device=meta\): parameter 'linear.weight' of PooledLinear is on cpu"):
        EmbeddingTower(nn.Identity(), PooledLinear(4, 2), device=torch.device("meta"))


def test_modules_built_on_meta_take_the_target_device_as_torchrecs():
    """TorchRec's models are built on meta for DistributedModelParallel, their towers told the device to come."""
    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
                                                             feature_names=["f"])], device=torch.device("meta"))
    tower = EmbeddingTower(ebc, nn.Identity(), device=torch.device("cpu"))
    assert tower.embedding is ebc
    collection = EmbeddingTowerCollection([tower], device=torch.device("cpu"))
    assert collection.towers[0] is tower
