"""The quantized FeatureProcessedEmbeddingBagCollection: quantize_inference_model swaps a float one as TorchRec 1.8
does (tables stored as fp_weight_dtype, the feature processors kept), outputs and state_dict equal to TorchRec's on
the same float weights; shard_quant_model shards it (one rank, and ranks held in one process) with the unsharded
quantized outputs."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.fx import symbolic_trace
from rectoolkit.inference.modules import quantize_inference_model, shard_quant_model
from rectoolkit.quant.fp_embedding_modules import QuantFeatureProcessedEmbeddingBagCollection

POSITION_WEIGHTS = torch.tensor([1.0, 0.5, 2.0])


def _model(lib, fp_module, pw_module, processors="collection"):
    """sparse.fp: a feature-processed collection of two tables (position weights on "f"); other: a plain one."""
    torch.manual_seed(0)
    ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"]),
        lib.EmbeddingBagConfig(name="u", num_embeddings=12, embedding_dim=4, feature_names=["g"])], is_weighted=True)
    if processors == "collection":
        fp = fp_module.FeatureProcessedEmbeddingBagCollection(
            ebc, pw_module.PositionWeightedModuleCollection({"f": 3}))
        weight = fp._feature_processors.position_weights["f"]
    else:
        fp = fp_module.FeatureProcessedEmbeddingBagCollection(
            ebc, {"f": pw_module.PositionWeightedModule(3), "g": pw_module.PositionWeightedModule(2)})
        weight = fp._feature_processors["f"].position_weight
    with torch.no_grad():
        weight.copy_(POSITION_WEIGHTS)
    model = torch.nn.Module()
    model.sparse = torch.nn.Module()
    model.sparse.fp = fp
    model.other = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name="v", num_embeddings=5, embedding_dim=4, feature_names=["h"])])
    return model


def _ours(processors="collection"):
    from rectoolkit.modules import feature_processor_, fp_embedding_modules

    return _model(rtk, fp_embedding_modules, feature_processor_, processors)


def _kjt(lib):
    return lib.KeyedJaggedTensor.from_lengths_sync(["f", "g"], torch.tensor([1, 2, 3, 4, 9, 0, 11]),
                                                   torch.tensor([3, 1, 0, 2, 1, 0]))


@pytest.mark.torchrec
def test_quantize_inference_model_swaps_it_as_torchrecs():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.inference.modules import quantize_inference_model as their_quantize
    from torchrec.modules import feature_processor_, fp_embedding_modules

    ours, theirs = _ours(), _model(torchrec, fp_embedding_modules, feature_processor_)
    theirs.load_state_dict(ours.state_dict())
    float_out = ours.sparse.fp(_kjt(rtk)).values()
    ours = quantize_inference_model(ours, per_table_weight_dtype={"u": torch.float16})
    theirs = their_quantize(theirs, per_table_weight_dtype={"u": torch.float16})
    assert isinstance(ours.sparse.fp, QuantFeatureProcessedEmbeddingBagCollection)
    assert ours.sparse.fp._get_name() == theirs.sparse.fp._get_name() == "QuantFeatureProcessedEmbeddingBagCollection"
    assert [c.data_type.name for c in ours.sparse.fp.embedding_bag_configs()] == \
        [c.data_type.name for c in theirs.sparse.fp.embedding_bag_configs()] == ["INT8", "FP16"]
    assert type(ours.other).__name__ == "QuantEmbeddingBagCollection"
    their_state = theirs.sparse.fp.state_dict()  # (TorchRec's also lists its registered TBEs' buffers)
    for key, value in ours.sparse.fp.state_dict().items():
        assert torch.equal(value, their_state[key]), key
    assert sorted(ours.sparse.fp.state_dict()) == ["embedding_bags.t.weight", "embedding_bags.u.weight",
                                                   "feature_processor.position_weights.f"]
    got, expected = ours.sparse.fp(_kjt(rtk)), theirs.sparse.fp(_kjt(torchrec))
    assert got.keys() == expected.keys()
    torch.testing.assert_close(got.values(), expected.values())
    torch.testing.assert_close(got.values(), float_out, atol=0.02, rtol=0.02)  # int8 rows: near the float ones


def test_per_feature_processors_and_a_model_that_is_one_are_quantized_too():
    model = _ours("dict")
    float_out = model.sparse.fp(_kjt(rtk)).values()
    quantized = quantize_inference_model(model)
    torch.testing.assert_close(quantized.sparse.fp(_kjt(rtk)).values(), float_out, atol=0.02, rtol=0.02)
    alone = quantize_inference_model(_ours().sparse.fp)  # the model itself: returned quantized
    assert isinstance(alone, QuantFeatureProcessedEmbeddingBagCollection)
    with pytest.raises(ValueError, match="feature_processor is None; use QuantEmbeddingBagCollection"):
        QuantFeatureProcessedEmbeddingBagCollection(alone.embedding_bag_configs(), True, "cpu")
    with pytest.raises(TypeError, match="takes a rectoolkit FeatureProcessedEmbeddingBagCollection, got a Linear"):
        QuantFeatureProcessedEmbeddingBagCollection.from_float(torch.nn.Linear(2, 2), dtype=torch.int8)


@pytest.mark.parametrize("world_size", [1, 2])
def test_shard_quant_model_shards_it_with_the_unsharded_outputs(world_size):
    quantized = quantize_inference_model(_ours())
    expected = quantized.sparse.fp(_kjt(rtk)).values()
    constraints = {"t": rtk.ParameterConstraints(sharding_types=["column_wise"]),
                   "u": rtk.ParameterConstraints(sharding_types=["row_wise"] if world_size > 1 else ["table_wise"])}
    sharded, plan = shard_quant_model(quantized, world_size=world_size, compute_device="cpu", sharding_device="cpu",
                                      constraints=constraints)
    assert plan.get_plan_for_module("sparse.fp")["t"].sharding_type == "column_wise"
    assert type(sharded.sparse.fp).__name__ == ("ShardedQuantFeatureProcessedEmbeddingBagCollection" if world_size == 1
                                                else "FeatureProcessedInOneProcess")
    torch.testing.assert_close(sharded.sparse.fp(_kjt(rtk)).values(), expected)
    assert sharded.sparse.fp.feature_processor.position_weights["f"].tolist() == POSITION_WEIGHTS.tolist()
    traced = symbolic_trace(sharded.sparse.fp)  # TorchRec's next step to serve it
    torch.testing.assert_close(traced(_kjt(rtk)).values(), expected)


@pytest.mark.torchrec
def test_the_sharder_and_sharded_module_are_at_torchrecs_paths():
    pytest.importorskip("torchrec")
    from torchrec.inference.modules import DEFAULT_SHARDERS

    from rectoolkit.distributed.quant_embeddingbag import QuantFeatureProcessedEmbeddingBagCollectionSharder
    from rectoolkit.inference.modules import default_quant_sharders
    from rectoolkit.quant.embedding_modules import FeatureProcessedEmbeddingBagCollection as AtTorchRecsPath

    assert AtTorchRecsPath is QuantFeatureProcessedEmbeddingBagCollection
    assert QuantFeatureProcessedEmbeddingBagCollectionSharder().module_type is QuantFeatureProcessedEmbeddingBagCollection
    assert [type(s).__name__ for s in default_quant_sharders()] == [type(s).__name__ for s in DEFAULT_SHARDERS]
