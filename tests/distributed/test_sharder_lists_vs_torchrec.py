"""The training sharders' `sharding_types(device)` and `compute_kernels(type, device)` beside TorchRec 1.8's: the
same lists in the same order, "dense" only for DATA_PARALLEL (TorchRec's sharders do not offer it for the other
types), without TorchRec's key-value and virtual-table kernels (rectoolkit has none). On CPU rectoolkit also runs
the types TorchRec 1.8 offers on CUDA only: its CPU list starts with TorchRec's.
"""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.torchrec

NO_SUCH_KERNELS = {"key_value", "ssd_virtual_table", "dram_virtual_table", "dram_ssd_virtual_table"}
SHARDERS = [("embeddingbag", "EmbeddingBagCollectionSharder"), ("embedding", "EmbeddingCollectionSharder"),
            ("fp_embeddingbag", "FeatureProcessedEmbeddingBagCollectionSharder"),
            ("mc_embeddingbag", "ManagedCollisionEmbeddingBagCollectionSharder"),
            ("mc_embedding", "ManagedCollisionEmbeddingCollectionSharder")]


def _sharders(module: str, name: str):
    pytest.importorskip("torchrec")
    return [getattr(importlib.import_module(f"{lib}.distributed.{module}"), name)()
            for lib in ("torchrec", "rectoolkit")]


@pytest.mark.parametrize("module, name", SHARDERS)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sharding_types_and_kernels_are_torchrecs(module, name, device):
    theirs, ours = _sharders(module, name)
    their_types, our_types = theirs.sharding_types(device), ours.sharding_types(device)
    if device == "cuda":
        assert our_types == their_types
    else:
        assert our_types[:len(their_types)] == their_types
    for sharding_type in their_types:
        expected = [k for k in theirs.compute_kernels(sharding_type, device) if k not in NO_SUCH_KERNELS]
        assert ours.compute_kernels(sharding_type, device) == expected, sharding_type


def test_dense_is_offered_for_data_parallel_only():
    ours = _sharders("embeddingbag", "EmbeddingBagCollectionSharder")[1]
    assert [t for t in ours.sharding_types("cpu") if "dense" in ours.compute_kernels(t, "cpu")] == ["data_parallel"]


@pytest.mark.parametrize("module, name, inner", [("mc_embeddingbag", "ManagedCollisionEmbeddingBagCollectionSharder",
                                                  ("embeddingbag", "EmbeddingBagCollectionSharder")),
                                                 ("mc_embedding", "ManagedCollisionEmbeddingCollectionSharder",
                                                  ("embedding", "EmbeddingCollectionSharder"))])
def test_managed_collision_sharders_take_torchrecs_arguments(module, name, inner):
    """TorchRec's constructor: (the embedding collection's sharder, a ManagedCollisionCollectionSharder,
    fused_params, qcomm_codecs_registry), positionally or by keyword; the fused params are the inner sharder's."""
    pytest.importorskip("torchrec")
    fused = {"optimizer": "sgd", "learning_rate": 0.25}
    seen = []
    for lib in ("torchrec", "rectoolkit"):
        outer = getattr(importlib.import_module(f"{lib}.distributed.{module}"), name)
        inner_sharder = getattr(importlib.import_module(f"{lib}.distributed.{inner[0]}"), inner[1])
        mc_sharder = importlib.import_module(f"{lib}.distributed.mc_modules").ManagedCollisionCollectionSharder()
        positional = outer(inner_sharder(fused_params=fused), mc_sharder)
        by_keyword = outer(fused_params=fused)
        seen.append((positional.fused_params, by_keyword.fused_params, mc_sharder.sharding_types("cpu"),
                     mc_sharder.sharding_types("cuda"), positional.sharding_types("cuda")))
        with pytest.raises(NotImplementedError):
            mc_sharder.shardable_parameters(None)
    assert seen[1] == seen[0] and seen[1][0] == fused


def test_managed_collision_sharder_refuses_what_it_would_ignore():
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from rectoolkit.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder as Sharder

    with pytest.raises(ValueError, match="both a sharder and fused_params given"):
        Sharder(EmbeddingBagCollectionSharder(), fused_params={"optimizer": "sgd"})
    with pytest.raises(TypeError, match="the first argument is the embedding collection's sharder.*got a dict"):
        Sharder({"optimizer": "sgd"})
    with pytest.raises(TypeError, match="mc_sharder must be a ManagedCollisionCollectionSharder, got a str"):
        Sharder(mc_sharder="row_wise")
