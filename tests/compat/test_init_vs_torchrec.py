"""One seed, TorchRec's weights: the collections draw their initial weights in TorchRec's order, so code that
seeds torch and builds a collection gets the same tables here as with TorchRec (and the same random numbers
afterwards)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import rectoolkit as rtk

torchrec = pytest.importorskip("torchrec")

pytestmark = pytest.mark.torchrec


def _halve(weight):
    with torch.no_grad():  # TorchRec calls init_fn with grad enabled
        weight.mul_(0.5)


def _configs(lib, cls, init_fn=None, data_type=None):
    extra = {} if init_fn is None else {"init_fn": init_fn}
    if data_type is not None:
        extra["data_type"] = getattr(lib.DataType, data_type)
    dims = [4, 8, 16] if cls == "EmbeddingBagConfig" else [8, 8, 8]
    return [getattr(lib, cls)(name=f"t{i}", num_embeddings=n, embedding_dim=d, feature_names=[f"f{i}"], **extra)
            for i, (n, d) in enumerate(zip([10, 37, 200], dims))]


def _build(lib, collection, config, seed, **config_kwargs):
    torch.manual_seed(seed)
    module = getattr(lib, collection)(tables=_configs(lib, config, **config_kwargs), device=torch.device("cpu"))
    after = torch.rand(5)  # the generator must be left where TorchRec leaves it
    return {k: v.detach().clone() for k, v in module.state_dict().items()}, after


@pytest.mark.parametrize("collection, config", [("EmbeddingBagCollection", "EmbeddingBagConfig"),
                                                ("EmbeddingCollection", "EmbeddingConfig")])
@pytest.mark.parametrize("init", ["default", "normal", "keeps_the_normal_draw", "fp16"])
def test_same_seed_gives_torchrecs_weights(collection, config, init):
    kwargs = {
        "default": {},
        "normal": {"init_fn": partial(torch.nn.init.normal_, mean=0.0, std=0.3)},
        # an init_fn that keeps part of the normal draw: the normal draws must be TorchRec's, not just counted
        "keeps_the_normal_draw": {"init_fn": _halve},
        "fp16": {"data_type": "FP16"},
    }[init]
    ours, our_after = _build(rtk, collection, config, 7, **kwargs)
    theirs, their_after = _build(torchrec, collection, config, 7, **kwargs)
    assert sorted(ours) == sorted(theirs)
    for key in theirs:
        assert ours[key].dtype == theirs[key].dtype, key
        assert torch.equal(ours[key], theirs[key]), key
    assert torch.equal(our_after, their_after)


def test_reset_parameters_redraws_as_torchrec():
    for collection, config in [("EmbeddingBagCollection", "EmbeddingBagConfig"), ("EmbeddingCollection", "EmbeddingConfig")]:
        modules = []
        for lib in (rtk, torchrec):
            module = getattr(lib, collection)(tables=_configs(lib, config), device=torch.device("cpu"))
            torch.manual_seed(3)
            module.reset_parameters()
            modules.append(module.state_dict())
        for key, theirs in modules[1].items():
            assert torch.equal(modules[0][key], theirs), (collection, key)


def test_meta_collections_draw_nothing():
    for lib in (rtk, torchrec):
        torch.manual_seed(5)
        lib.EmbeddingBagCollection(tables=_configs(lib, "EmbeddingBagConfig"), device=torch.device("meta"))
        lib.EmbeddingCollection(tables=_configs(lib, "EmbeddingConfig"), device=torch.device("meta"))
        drawn = torch.rand(3)
        torch.manual_seed(5)
        assert torch.equal(drawn, torch.rand(3)), lib.__name__
