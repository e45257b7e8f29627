"""TorchRec's per-table options: ModuleSharder, CacheParams, and the ParameterConstraints fields enforce_hbm,
bounds_check_mode, output_dtype, stochastic_rounding, cache_params, num_poolings. Each is carried into the plan's
ParameterSharding exactly as TorchRec 1.8's planner puts it (differential, same constraints), survives JSON and
TorchRec export, and is checked when the table is sharded; what rectoolkit cannot honour is refused, naming it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.sharded_ebc import shard_embedding_bag_collection
from rectoolkit.distributed.types import BoundsCheckMode, CacheAlgorithm, CacheParams, DataType, ModuleSharder
from rectoolkit.plan.serialization import plan_from_dict, plan_to_dict
from rectoolkit.plan.types import ParameterSharding, ShardMetadata
from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

OPTIONS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype")


def _name(value):
    return getattr(value, "name", value)


def _options(ps):
    return {option: _name(getattr(ps, option)) for option in OPTIONS if option != "cache_params"}


@pytest.mark.torchrec
def test_the_planner_carries_the_options_as_torchrecs():
    torchrec = pytest.importorskip("torchrec")
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode as FbgemmBoundsCheckMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm as FbgemmCacheAlgorithm
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner as TorchRecPlanner, Topology as TorchRecTopology
    from torchrec.distributed.planner.types import ParameterConstraints as TorchRecConstraints
    from torchrec.distributed.types import CacheParams as TorchRecCacheParams
    from torchrec.types import DataType as TorchRecDataType

    def constraints(lib_constraints, cache, bounds, dtype):
        return {"a": lib_constraints(sharding_types=["table_wise"], enforce_hbm=True, stochastic_rounding=False,
                                     bounds_check_mode=bounds.FATAL, output_dtype=dtype.FP32, num_poolings=[1.0],
                                     cache_params=cache),
                "b": lib_constraints(sharding_types=["table_wise"], stochastic_rounding=True,
                                     bounds_check_mode=bounds.V2_FATAL)}

    their_cache = TorchRecCacheParams(algorithm=FbgemmCacheAlgorithm.LFU, load_factor=0.3)
    their_ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name=n, embedding_dim=8, num_embeddings=100, feature_names=[n]) for n in "abc"], device=torch.device("meta"))
    expected = TorchRecPlanner(topology=TorchRecTopology(world_size=2, compute_device="cpu"), constraints=constraints(
        TorchRecConstraints, their_cache, FbgemmBoundsCheckMode, TorchRecDataType)).plan(
        their_ebc, [EmbeddingBagCollectionSharder()]).plan[""]

    my_ebc = rtk.EmbeddingBagCollection(tables=[rtk.EmbeddingBagConfig(
        name=n, embedding_dim=8, num_embeddings=100, feature_names=[n]) for n in "abc"], device=torch.device("meta"))
    for cache, bounds, dtype in ((their_cache, FbgemmBoundsCheckMode, TorchRecDataType),  # TorchRec's objects
                                 (CacheParams(algorithm=CacheAlgorithm.LFU, load_factor=0.3), BoundsCheckMode, DataType)):
        got = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"),
                                       constraints=constraints(ParameterConstraints, cache, bounds, dtype)).plan(my_ebc)
        for table in "abc":
            assert _options(got.plan[""][table]) == _options(expected[table]), table
        assert got.plan[""]["a"].cache_params is cache and expected["b"].cache_params is None
        assert got.plan[""]["b"].cache_params is None and got.plan[""]["c"].enforce_hbm is None

    # TorchRec's fields, in TorchRec's order
    assert [f.name for f in dataclasses.fields(CacheParams)] == [f.name for f in dataclasses.fields(TorchRecCacheParams)]
    assert {m.name: m.value for m in BoundsCheckMode} == {m.name: m.value for m in FbgemmBoundsCheckMode}
    assert {m.name: m.value for m in CacheAlgorithm} == {m.name: m.value for m in FbgemmCacheAlgorithm}


def _plan(**options):
    shard = ShardMetadata([0, 0], [10, 4], "rank:0/cpu")
    return {"t": ParameterSharding("table_wise", "fused", [0], [shard], **options)}


def _ebc(data_type=DataType.FP32, ids_out_of_range="error"):
    return rtk.EmbeddingBagCollection(tables=[rtk.EmbeddingBagConfig(
        name="t", embedding_dim=4, num_embeddings=10, feature_names=["f"], data_type=data_type)],
        optimizer="sgd", lr=0.1, ids_out_of_range=ids_out_of_range)


def test_options_carried_through_json_and_checked_when_sharded():
    plan = rtk.ShardingPlan({"": _plan(enforce_hbm=True, stochastic_rounding=True, bounds_check_mode=BoundsCheckMode.FATAL,
                                       output_dtype=DataType.FP32, cache_params=CacheParams(load_factor=0.5))})
    again = plan_from_dict(plan_to_dict(plan))
    assert _options(again.plan[""]["t"]) == _options(plan.plan[""]["t"]) == {
        "enforce_hbm": True, "stochastic_rounding": True, "bounds_check_mode": "FATAL", "output_dtype": "FP32"}
    env = ShardingEnv.local(torch.device("cpu"))
    sharded = shard_embedding_bag_collection(_ebc(), again.plan[""], env)  # honoured: the id check raises (FATAL)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor([3, 12]), lengths=torch.tensor([2]))
    with pytest.raises(ValueError, match=r"id 12 of feature 'f' \(sample 0\) is out of range"):
        sharded(kjt)

    with pytest.raises(NotImplementedError, match=r"table 't'.*bounds_check_mode=FATAL.*ids_out_of_range='hash'"):
        shard_embedding_bag_collection(_ebc(ids_out_of_range="hash"), _plan(bounds_check_mode=BoundsCheckMode.FATAL), env)
    with pytest.raises(NotImplementedError, match=r"table 't'.*stochastic_rounding=False for a FP16 table"):
        shard_embedding_bag_collection(_ebc(DataType.FP16), _plan(stochastic_rounding=False), env)
    with pytest.raises(NotImplementedError, match=r"table 't'.*output_dtype=FP16"):
        shard_embedding_bag_collection(_ebc(), _plan(output_dtype=DataType.FP16), env)


@pytest.mark.torchrec
def test_to_torchrec_carries_the_options():
    pytest.importorskip("torchrec")
    from torchrec.types import DataType as TorchRecDataType

    from rectoolkit.plan.torchrec_interop import from_torchrec, to_torchrec

    cache = CacheParams(algorithm=CacheAlgorithm.LRU, load_factor=0.25, prefetch_pipeline=True)
    theirs = to_torchrec(rtk.ShardingPlan({"": _plan(enforce_hbm=False, output_dtype=DataType.FP32, cache_params=cache,
                                                     bounds_check_mode=BoundsCheckMode.V2_FATAL)})).plan[""]["t"]
    assert (theirs.enforce_hbm, theirs.output_dtype, theirs.bounds_check_mode) == (False, TorchRecDataType.FP32, 6)
    assert (theirs.cache_params.load_factor, theirs.cache_params.prefetch_pipeline) == (0.25, True)
    back = from_torchrec(to_torchrec(rtk.ShardingPlan({"": _plan(stochastic_rounding=False)}))).plan[""]["t"]
    assert back.stochastic_rounding is False and back.enforce_hbm is None


@pytest.mark.parametrize("field,value,message", [
    ("num_poolings", [2.0], "pool each feature once per sample"),
    ("output_dtype", DataType.FP16, "output fp32"),
    ("bounds_check_mode", BoundsCheckMode.WARNING, "ids_out_of_range='hash'"),
    ("key_value_params", object(), "SSD and virtual tables"),
    ("use_virtual_table", True, "SSD and virtual tables"),
])
def test_constraints_refuse_what_cannot_be_honoured(field, value, message):
    with pytest.raises(NotImplementedError, match=message):
        ParameterConstraints(**{field: value})


def test_module_sharder_is_the_base_of_every_sharder():
    from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
    from rectoolkit.quant.sharding import QuantEmbeddingBagCollectionSharder

    for sharder in (EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder(), QuantEmbeddingBagCollectionSharder()):
        assert isinstance(sharder, ModuleSharder) and sharder.qcomm_codecs_registry is None
    with pytest.raises(TypeError, match="abstract"):
        ModuleSharder()
    ebc = _ebc()
    assert list(EmbeddingBagCollectionSharder().shardable_parameters(ebc)) == ["t"]
    assert EmbeddingBagCollectionSharder().storage_usage(ebc.embedding_bags["t"].weight, "cuda", "fused") == {"hbm": 160}
