"""TorchRec's constructor calls, run unchanged against rectoolkit's classes: the same arguments (positional
and keyword) build the same thing, and what rectoolkit cannot honour is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed.types import CacheParams, ShardingEnv
from rectoolkit.modules.embedding_configs import DataType
from rectoolkit.optim.keyed import KeyedOptimizerWrapper

torchrec = pytest.importorskip("torchrec")
from torchrec.distributed.types import ShardingEnv as TheirShardingEnv  # noqa: E402
from torchrec.modules.embedding_configs import DataType as TheirDataType  # noqa: E402
from torchrec.optim.keyed import KeyedOptimizerWrapper as TheirKeyedOptimizerWrapper  # noqa: E402

pytestmark = pytest.mark.torchrec


@pytest.mark.parametrize("args, kwargs", [((2, 0), {}), ((2, 1), {}), ((), {"world_size": 4, "rank": 3}),
                                          ((1, 0, None), {})])
def test_sharding_env_takes_torchrecs_arguments_in_its_order(args, kwargs):
    ours, theirs = ShardingEnv(*args, **kwargs), TheirShardingEnv(*args, **kwargs)
    assert (ours.world_size, ours.rank, ours.process_group) == (theirs.world_size, theirs.rank, theirs.process_group)
    assert ours.local_world_size == ours.world_size  # one host unless told


def test_sharding_env_refuses_what_it_cannot_honour():
    with pytest.raises(NotImplementedError, match="output_dtensor=True"):
        ShardingEnv(2, 0, None, True)
    with pytest.raises(ValueError, match="rank 2 is not in 0..1"):
        ShardingEnv(2, 2)
    assert ShardingEnv(4, 1, local_world_size=2).local_world_size == 2


def test_data_type_prints_as_torchrecs():
    for ours in DataType:
        theirs = TheirDataType[ours.name]
        assert str(ours) == str(theirs) == ours.value
        assert f"{ours}" == f"{theirs}"


def test_keyed_optimizer_wrapper_passes_the_params_dict_when_asked():
    params = {"a": torch.nn.Parameter(torch.ones(2)), "b": torch.nn.Parameter(torch.zeros(3))}
    given = {}

    def factory(p):
        given["params"] = p
        return torch.optim.SGD(list(p.values()) if isinstance(p, dict) else p, lr=0.1)

    for cls in (KeyedOptimizerWrapper, TheirKeyedOptimizerWrapper):
        cls(params, factory, pass_params_dict=True)
        assert given["params"] is params
        cls(params, factory)
        assert isinstance(given["params"], list) and [id(t) for t in given["params"]] == [id(t) for t in params.values()]


def test_a_misspelt_collection_argument_is_a_type_error_as_in_torchrec():
    tables = [rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2, feature_names=["f"])]
    with pytest.raises(TypeError):
        torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
            name="t", num_embeddings=4, embedding_dim=2, feature_names=["f"])], is_weigthed=True)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['is_weigthed'\]"):
        rtk.EmbeddingBagCollection(tables=tables, is_weigthed=True)
    with pytest.raises(TypeError, match=r"\['need_indice'\]"):
        rtk.EmbeddingCollection(tables=[rtk.EmbeddingConfig(name="t", num_embeddings=4, embedding_dim=2,
                                                             feature_names=["f"])], need_indice=True)
    with pytest.raises(ValueError, match="lr given without optimizer"):
        rtk.EmbeddingBagCollection(tables=tables, lr=0.1)


def test_half_and_float_convert_the_tables_as_torchrecs_do():
    def tables(lib):
        return [lib.EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])]

    theirs, ours = torchrec.EmbeddingBagCollection(tables=tables(torchrec)), rtk.EmbeddingBagCollection(tables=tables(rtk))
    ours.load_state_dict(theirs.state_dict())
    theirs, ours = theirs.half(), ours.half()
    assert [p.dtype for p in ours.parameters()] == [p.dtype for p in theirs.parameters()] == [torch.float16]
    ids, lengths = torch.tensor([1, 2, 3]), torch.tensor([2, 1])
    expected = theirs(torchrec.KeyedJaggedTensor.from_lengths_sync(["f"], ids, lengths)).values()
    got = ours(rtk.KeyedJaggedTensor.from_lengths_sync(["f"], ids, lengths)).values()
    assert got.dtype == expected.dtype  # the float16 rows, pooled in float32 (summed in another order)
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    ours = ours.float()
    assert [p.dtype for p in ours.parameters()] == [torch.float32]
    torch.testing.assert_close(ours(rtk.KeyedJaggedTensor.from_lengths_sync(["f"], ids, lengths)).values(), expected,
                               atol=1e-3, rtol=1e-3)  # float32 tables holding the float16 values
    assert [p.dtype for p in ours.double().parameters()] == [p.dtype for p in theirs.double().parameters()]


def test_topology_takes_torchrecs_arguments_in_its_order():
    from torchrec.distributed.planner.types import Topology as TheirTopology

    args = (4, "cpu", 0, 64 * 2**30, 2**40, 2, None, 1.5e6, 5.0e4, 1.0e5, 3.0e4, 6.0e5, 1.0e4, 1.5)
    ours, theirs = rtk.Topology(*args), TheirTopology(*args)
    assert (ours.world_size, ours.compute_device, ours.local_world_size) == (4, "cpu", 2)
    assert ours.ddr_cap == theirs.devices[0].storage.ddr == 64 * 2**30
    assert ours.ssd_cap == theirs.devices[0].storage.ssd == 2**40
    assert (ours.hbm_mem_bw, ours.ddr_mem_bw, ours.ssd_mem_bw) == (theirs.hbm_mem_bw, theirs.ddr_mem_bw, theirs.ssd_mem_bw)
    assert (ours.hbm_to_ddr_mem_bw, ours.intra_host_bw, ours.inter_host_bw) == (
        theirs.hbm_to_ddr_mem_bw, theirs.intra_host_bw, theirs.inter_host_bw)
    assert ours.bwd_compute_multiplier == theirs.bwd_compute_multiplier == 1.5


def test_topology_refuses_torchrecs_fields_it_cannot_price():
    with pytest.raises(ValueError, match="pod_size=8 cannot be greater than world_size=4"):
        rtk.Topology(4, "cpu", pod_size=8)
    with pytest.raises(NotImplementedError, match="pod_size=2 .* leave pod_size None"):
        rtk.Topology(4, "cpu", local_world_size=1, pod_size=2)
    assert rtk.Topology(4, "cpu", pod_size=1).pod_size == 1
    with pytest.raises(NotImplementedError, match="uneven_sharding_perf_multiplier=1.2"):
        rtk.Topology(2, "cpu", uneven_sharding_perf_multiplier=1.2)
    with pytest.raises(NotImplementedError, match="custom_topology_data=.*hbm_cap=\\[...\\]"):
        rtk.Topology(2, "cpu", custom_topology_data=object())
    with pytest.raises(NotImplementedError, match="generalized_comms_bandwidths"):
        rtk.Topology(2, "cpu", generalized_comms_bandwidths=object())


def test_parameter_constraints_take_torchrecs_arguments_in_its_order():
    from torchrec.distributed.planner.types import ParameterConstraints as TheirConstraints
    from rectoolkit.planner.constraints import ParameterConstraints

    args = (["table_wise"], ["fused"], None, [2.0], None, None, False, None, True)
    ours, theirs = ParameterConstraints(*args), TheirConstraints(*args)
    for name in ("sharding_types", "compute_kernels", "pooling_factors", "is_weighted", "cache_params", "enforce_hbm"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_parameter_sharding_takes_torchrecs_arguments_and_sharding_spec():
    from torch.distributed._shard.metadata import ShardMetadata as TorchShard
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec as TorchSpec
    from torchrec.distributed.types import ParameterSharding as TheirSharding

    from rectoolkit.distributed.types import EnumerableShardingSpec, ParameterSharding, ShardMetadata

    torch_shards = [TorchShard([0, 0], [6, 4], "rank:0/cpu"), TorchShard([6, 0], [4, 4], "rank:1/cpu")]
    args = ("row_wise", "fused", [0, 1], TorchSpec(torch_shards), CacheParams(load_factor=0.5), True, False)
    ours, theirs = ParameterSharding(*args), TheirSharding(*args)
    assert [(s.shard_offsets, s.shard_sizes, s.placement) for s in ours.shards] == \
        [(s.shard_offsets, s.shard_sizes, str(s.placement)) for s in theirs.sharding_spec.shards]
    for name in ("sharding_type", "compute_kernel", "ranks", "cache_params", "enforce_hbm", "stochastic_rounding"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.sharding_spec.shards == ours.shards and ours.shards[1].rank == 1

    ours_spec = ParameterSharding("table_wise", "fused", [1],
                                  EnumerableShardingSpec([ShardMetadata([0, 0], [10, 4], "rank:1/cpu")]))
    assert ours_spec == ParameterSharding("table_wise", "fused", [1], shards=[ShardMetadata([0, 0], [10, 4], "rank:1/cpu")])
    assert dataclasses.replace(ours_spec, ranks=[1]) == ours_spec  # init=False dataclass: replace() still works
    with pytest.raises(TypeError, match="give the shards once"):
        ParameterSharding("table_wise", "fused", [1], ours_spec.sharding_spec, shards=ours_spec.shards)
    with pytest.raises(NotImplementedError, match="key_value_params=.*no key-value kernel"):
        ParameterSharding("table_wise", "fused", [0], None, None, None, None, None, None, object())


def test_shard_metadata_without_placement_is_refused_where_a_plan_is_checked():
    from rectoolkit.distributed.types import ParameterSharding, ShardingPlan, ShardMetadata
    from rectoolkit.plan.validation import PlanValidationError, validate_plan

    unplaced = ShardMetadata(shard_offsets=[0, 0], shard_sizes=[10, 4])
    assert unplaced.placement is None
    with pytest.raises(ValueError, match=r"shard_sizes=\[10, 4\]\) has no placement.*placement='rank:0/cpu'"):
        unplaced.rank
    plan = ShardingPlan({"": {"t": ParameterSharding("table_wise", "fused", [0], [unplaced])}})
    with pytest.raises(PlanValidationError, match="table t: shard 0 .* has no placement"):
        validate_plan(plan, {"t": (10, 4)}, world_size=2)


def test_config_helpers_and_collection_interfaces_as_torchrecs():
    from torchrec.modules import embedding_configs as theirs
    from torchrec.modules import embedding_modules as their_modules

    from rectoolkit.modules import embedding_configs as ours
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollectionInterface, EmbeddingCollectionInterface
    from rectoolkit.quant.embedding_modules import QuantEmbeddingBagCollection, QuantEmbeddingCollection

    for name in ("FP32", "FP16", "BF16", "INT64", "INT32", "INT8", "UINT8", "INT4", "INT2"):
        assert ours.data_type_to_dtype(getattr(ours.DataType, name)) == \
            theirs.data_type_to_dtype(getattr(theirs.DataType, name)), name
    for dtype in (torch.float32, torch.half, torch.bfloat16, torch.int32, torch.long, torch.qint8, torch.quint8,
                  torch.int8, torch.uint8, torch.quint4x2, torch.quint2x4):
        assert ours.dtype_to_data_type(dtype).value == theirs.dtype_to_data_type(dtype).value, dtype
    for pooling in ("SUM", "MEAN"):
        assert ours.pooling_type_to_str(ours.PoolingType(pooling)) == theirs.pooling_type_to_str(theirs.PoolingType(pooling))
    with pytest.raises(ValueError, match="Unsupported pooling type"):
        ours.pooling_type_to_str(ours.PoolingType.NONE)
    args = (10, 4, "t", DataType.FP32, ["f"])
    assert ours.EmbeddingTableConfig(*args, is_weighted=True).is_weighted
    assert [f.name for f in dataclasses.fields(theirs.EmbeddingTableConfig)][-4:] == \
        [f.name for f in dataclasses.fields(ours.EmbeddingTableConfig)][-4:]
    assert set(their_modules.EmbeddingBagCollectionInterface.__abstractmethods__) == \
        set(EmbeddingBagCollectionInterface.__abstractmethods__)
    assert set(their_modules.EmbeddingCollectionInterface.__abstractmethods__) == \
        set(EmbeddingCollectionInterface.__abstractmethods__)
    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4)])
    assert isinstance(ebc, EmbeddingBagCollectionInterface) and isinstance(ebc, rtk.EmbeddingBagCollectionInterface)
    assert issubclass(rtk.EmbeddingCollection, EmbeddingCollectionInterface)
    assert issubclass(QuantEmbeddingBagCollection, EmbeddingBagCollectionInterface)
    assert issubclass(QuantEmbeddingCollection, EmbeddingCollectionInterface)


def test_parameter_sharding_and_shard_metadata_print_as_torchrecs():
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec as TorchSpec
    from torchrec.distributed import types as theirs

    from rectoolkit.distributed import types as ours

    def build(lib):
        shards = [lib.ShardMetadata([0, 0], [5, 4], "rank:0/cpu"), lib.ShardMetadata([5, 0], [5, 4], "rank:1/cpu")]
        return [lib.ParameterSharding("row_wise", "fused", [0, 1], TorchSpec(shards), enforce_hbm=True),
                lib.ParameterSharding("table_wise", "fused", [0]), lib.ShardMetadata([0, 0], [5, 4])]

    assert [repr(x) for x in build(ours)] == [repr(x) for x in build(theirs)]
