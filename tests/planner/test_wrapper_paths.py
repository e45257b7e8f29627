"""Where the planner keys the tables of a FeatureProcessedEmbeddingBagCollection, beside TorchRec 1.8's planner.

TorchRec plans such a collection at its own path ("fp") when its sharder (FeatureProcessedEmbeddingBagCollectionSharder,
in TorchRec's default sharders) is given, and at the inner collection's path ("fp._embedding_bag_collection") when
only the EmbeddingBagCollectionSharder is. Each case is one TorchRec planner call and the same rectoolkit call, on
the same model built from each library's classes. Managed-collision collections follow the same rule.
"""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from torch import nn

import rectoolkit as rtk
from rectoolkit.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from rectoolkit.distributed.sharding_plan import get_default_sharders
from rectoolkit.planner.tables import at_wrapper_paths, collect_tables


def _model(lib_name: str) -> nn.Module:
    fp = importlib.import_module(f"{lib_name}.modules.fp_embedding_modules")
    processors = importlib.import_module(f"{lib_name}.modules.feature_processor_")
    lib = importlib.import_module(lib_name)
    tables = [lib.EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=100, feature_names=[f"f{i}"])
              for i in range(2)]
    ebc = lib.EmbeddingBagCollection(tables=tables, is_weighted=True, device=torch.device("meta"))
    model = nn.Module()
    model.fp = fp.FeatureProcessedEmbeddingBagCollection(
        ebc, {f"f{i}": processors.PositionWeightedModule(max_feature_length=4) for i in range(2)})
    return model


def _sharders(lib_name: str, which: str):
    if which == "default":
        return importlib.import_module(f"{lib_name}.distributed.sharding_plan").get_default_sharders()
    if which == "fp":
        return [importlib.import_module(f"{lib_name}.distributed.fp_embeddingbag")
                .FeatureProcessedEmbeddingBagCollectionSharder()]
    return [importlib.import_module(f"{lib_name}.distributed.embeddingbag").EmbeddingBagCollectionSharder()]


def _keys(lib_name: str, which: str):
    planner = importlib.import_module(f"{lib_name}.distributed.planner")
    topology = planner.Topology(world_size=2, compute_device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = planner.EmbeddingShardingPlanner(topology=topology).plan(_model(lib_name), _sharders(lib_name, which))
    return {path: sorted(tables) for path, tables in plan.plan.items()}


@pytest.mark.parametrize("which", ["default", "fp", "ebc"])
def test_feature_processed_tables_keyed_as_torchrec_keys_them(which):
    pytest.importorskip("torchrec")
    expected = {"fp": ["t0", "t1"]} if which != "ebc" else {"fp._embedding_bag_collection": ["t0", "t1"]}
    assert _keys("torchrec", which) == expected  # (what TorchRec does, so that the comparison below means it)
    assert _keys("rectoolkit", which) == expected


def test_torchrec_own_sharder_object_plans_at_the_wrapper_path():
    torchrec_fp = pytest.importorskip("torchrec.distributed.fp_embeddingbag")
    planner = rtk.EmbeddingShardingPlanner(topology=rtk.Topology(world_size=2, compute_device="cpu"))
    plan = planner.plan(_model("rectoolkit"), [torchrec_fp.FeatureProcessedEmbeddingBagCollectionSharder()])
    assert list(plan.plan) == ["fp"]


def test_no_sharder_for_the_wrapper_or_its_collection_leaves_its_tables_unplanned_as_torchrec():
    planner = rtk.EmbeddingShardingPlanner(topology=rtk.Topology(world_size=2, compute_device="cpu"))
    assert planner.plan(_model("rectoolkit"), [rtk.distributed.EmbeddingCollectionSharder()]).plan == {}
    torchrec_planner = pytest.importorskip("torchrec.distributed.planner")
    torchrec_embedding = pytest.importorskip("torchrec.distributed.embedding")
    theirs = torchrec_planner.EmbeddingShardingPlanner(
        topology=torchrec_planner.Topology(world_size=2, compute_device="cpu")).plan(
        _model("torchrec"), [torchrec_embedding.EmbeddingCollectionSharder()])
    assert theirs.plan == {}


def test_managed_collision_tables_at_the_wrapper_path_with_its_sharder():
    tables = collect_tables(_mc_model(), 64)
    assert {t.module_path for t in at_wrapper_paths(tables, _mc_model(), None)} == {"mc"}
    ebc_only = at_wrapper_paths(tables, _mc_model(), [rtk.distributed.EmbeddingBagCollectionSharder()])
    assert {t.module_path for t in ebc_only} == {"mc._embedding_module"}
    with_mc = at_wrapper_paths(tables, _mc_model(), get_default_sharders())
    assert {(t.module_path, t.wrapper) for t in with_mc} == {("mc", "ManagedCollisionEmbeddingBagCollection")}


def _mc_model() -> nn.Module:
    from rectoolkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from rectoolkit.modules.mc_modules import (DistanceLFU_EvictionPolicy, ManagedCollisionCollection,
                                               MCHManagedCollisionModule)

    tables = [rtk.EmbeddingBagConfig(name="users", embedding_dim=8, num_embeddings=64, feature_names=["user"])]
    collisions = ManagedCollisionCollection({"users": MCHManagedCollisionModule(
        zch_size=64, device=torch.device("cpu"), eviction_policy=DistanceLFU_EvictionPolicy(), eviction_interval=2)},
                                            tables)
    model = nn.Module()
    model.mc = ManagedCollisionEmbeddingBagCollection(rtk.EmbeddingBagCollection(tables), collisions)
    return model


def test_default_sharders_are_torchrecs_in_its_order():
    theirs = pytest.importorskip("torchrec.distributed.sharding_plan").get_default_sharders()
    ours = [type(s).__name__ for s in get_default_sharders()]
    their_names = [type(s).__name__ for s in theirs]
    assert ours == [name for name in their_names if name in ours]
    # the ones left out are the collections rectoolkit does not have (fused, quantized managed-collision)
    assert sorted(set(their_names) - set(ours)) == ["FusedEmbeddingBagCollectionSharder",
                                                     "QuantManagedCollisionEmbeddingCollectionSharder"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_feature_processed_sharder_types_are_torchrecs(device):
    theirs = pytest.importorskip("torchrec.distributed.fp_embeddingbag").FeatureProcessedEmbeddingBagCollectionSharder()
    assert FeatureProcessedEmbeddingBagCollectionSharder().sharding_types(device) == theirs.sharding_types(device)


def test_feature_processed_sharder_refuses_what_it_cannot_use():
    with pytest.raises(TypeError, match="pass an EmbeddingBagCollectionSharder"):
        FeatureProcessedEmbeddingBagCollectionSharder(ebc_sharder=rtk.distributed.EmbeddingCollectionSharder)
    with pytest.raises(ValueError, match="are not CommOp names"):
        FeatureProcessedEmbeddingBagCollectionSharder(qcomm_codecs_registry={"forward": None})
    with pytest.raises(TypeError, match="shards FeatureProcessedEmbeddingBagCollection"):
        FeatureProcessedEmbeddingBagCollectionSharder().shard(_model("rectoolkit").fp._embedding_bag_collection, {},
                                                              None)
