"""TorchRec's module paths resolve in rectoolkit to the same objects as the top-level names, so code written
against `torchrec.sparse.jagged_tensor.KeyedJaggedTensor`, `torchrec.distributed.planner.Topology`, ... runs
with `import rectoolkit as torchrec`. Every path checked here exists in TorchRec too (when it is installed)."""

import importlib
import importlib.util
import subprocess
import sys

import pytest
import torch

import rectoolkit
import rectoolkit as torchrec_alias
import rectoolkit.metrics  # noqa: F401  (neither package imports its metrics: code imports them first)

PATHS = {
    "sparse.jagged_tensor": ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "jt_is_equal", "kjt_is_equal",
                             "ComputeKJTToJTDict", "ComputeJTDictToKJT", "regroup_kts", "flatten_kjt_list",
                             "unflatten_kjt_list"],
    "sparse.jagged_tensor_validator": ["validate_keyed_jagged_tensor"],
    "modules.regroup": ["KTRegroupAsDict"],
    "modules.utils": ["construct_modulelist_from_single_module", "convert_list_of_modules_to_modulelist",
                      "extract_module_or_tensor_callable", "get_module_output_dimension",
                      "check_module_output_dimension", "init_mlp_weights_xavier_uniform", "deterministic_dedup",
                      "construct_jagged_tensors", "construct_jagged_tensors_inference", "SequenceVBEContext",
                      "jagged_index_select_with_empty"],
    "modules.embedding_configs": ["EmbeddingBagConfig", "EmbeddingConfig", "PoolingType", "DataType", "QuantConfig"],
    "modules.embedding_modules": ["EmbeddingBagCollection", "EmbeddingCollection"],
    "modules.mc_modules": ["ManagedCollisionCollection", "ManagedCollisionModule", "MCHManagedCollisionModule",
                           "MCHEvictionPolicy", "LFU_EvictionPolicy", "LRU_EvictionPolicy",
                           "DistanceLFU_EvictionPolicy", "dynamic_threshold_filter", "average_threshold_filter",
                           "probabilistic_threshold_filter"],
    "modules.mc_embedding_modules": ["ManagedCollisionEmbeddingBagCollection", "ManagedCollisionEmbeddingCollection"],
    "distributed.types": ["ShardingBucketMetadata", "NoOpQuantizedCommCodec", "CacheStatistics", "compute_storage_usage", "ShardingType", "ShardingPlan", "ParameterSharding", "ShardingEnv", "ShardMetadata",
                          "LazyAwaitable", "EmbeddingModuleShardingPlan", "ModuleSharder", "CommOp",
                          "QuantizedCommCodecs", "ShardingEnv2D", "DMPCollectionConfig", "ShardingStrategy"],
    "distributed.planner": ["EmbeddingShardingPlanner", "Topology", "ParameterConstraints"],
    "distributed.planner.types": ["Topology", "ParameterConstraints", "PlannerError", "ShardingPlan", "ModuleSharder",
                                  "StorageUsageType"],
    "distributed.planner.planners": ["EmbeddingShardingPlanner"],
    "distributed.planner.storage_reservations": ["HeuristicalStorageReservation", "FixedPercentageStorageReservation",
                                                 "FixedAbsoluteStorageReservation"],
    "distributed.planner.constants": ["BATCHED_COPY_PERF_FACTOR", "BATCH_SIZE", "BIGINT_DTYPE",
                                     "BWD_COMPUTE_MULTIPLIER", "CROSS_NODE_BANDWIDTH", "DDR_CAP", "DDR_MEM_BW",
                                     "DEFAULT_PERF_ESTIMATOR", "DP_ELEMENTWISE_KERNELS_PERF_FACTOR",
                                     "FULL_BLOCK_EMB_DIM", "HALF_BLOCK_PENALTY", "HBM_CAP", "HBM_MEM_BW",
                                     "HBM_TO_DDR_MEM_BW", "HUNDRED_GB", "INTRA_NODE_BANDWIDTH", "KV_CACHING_RATIO",
                                     "MAX_SIZE", "MIN_CW_DIM", "NUM_POOLINGS", "POOLING_FACTOR",
                                     "QUARTER_BLOCK_PENALTY", "SSD_CAP", "SSD_MEM_BW", "UVM_CACHING_RATIO",
                                     "WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER", "WEIGHTED_KERNEL_MULTIPLIER",
                                     "kernel_bw_lookup"],
    "distributed.planner.utils": ["BinarySearchPredicate", "bytes_to_gb", "bytes_to_mb", "gb_to_bytes",
                                 "mb_to_bytes", "placement", "prod", "sharder_name", "storage_repr_in_gb"],
    "distributed.planner.stats": ["EmbeddingStats", "NoopEmbeddingStats"],
    "distributed.comm_ops": ["set_gradient_division", "get_gradient_division", "set_use_sync_collectives",
                             "get_use_sync_collectives", "torchrec_use_sync_collectives", "Request",
                             "alltoall_pooled", "alltoall_sequence", "variable_batch_alltoall_pooled",
                             "reduce_scatter_pooled",
                             "reduce_scatter_base_pooled", "reduce_scatter_v_pooled",
                             "reduce_scatter_v_per_feature_pooled", "all_gather_base_pooled",
                             "reduce_scatter_tensor", "all_gather_into_tensor", "pg_name", "GRADIENT_DIVISION",
                             "USE_SYNC_COLLECTIVES",
                             "All2AllPooledInfo",
                             "VariableBatchAll2AllPooledInfo", "All2AllSequenceInfo", "All2AllVInfo",
                             "ReduceScatterInfo", "ReduceScatterBaseInfo", "AllGatherBaseInfo", "ReduceScatterVInfo",
                             "All2AllDenseInfo"],
    "distributed.utils": ["none_throws", "append_prefix", "filter_state_dict", "add_prefix_to_state_dict",
                          "get_unsharded_module_names", "copy_to_device", "sharded_model_copy", "merge_fused_params",
                          "add_params_from_parameter_sharding", "convert_to_fbgemm_types", "get_device_type",
                          "get_class_name", "assert_instance", "optimizer_type_to_emb_opt_type",
                          "emb_opt_type_to_optimizer_class", "init_parameters", "CopyableMixin",
                          "create_global_tensor_shape_stride_from_metadata", "get_bucket_metadata_from_shard_metadata",
                          "ShardingBucketMetadata"],
    "distributed.collective_utils": ["is_leader", "invoke_on_rank_and_broadcast_result", "run_on_leader",
                                     "create_on_rank_and_share_result"],
    "distributed.dist_data": ["KJTAllToAll", "KJTAllToAllSplitsAwaitable", "KJTAllToAllTensorsAwaitable",
                              "SplitsAllToAllAwaitable", "PooledEmbeddingsAwaitable", "PooledEmbeddingsAllToAll",
                              "PooledEmbeddingsReduceScatter", "PooledEmbeddingsAllGather", "SequenceEmbeddingsAllToAll",
                              "SequenceEmbeddingsAwaitable", "VariableBatchPooledEmbeddingsAllToAll", "KJTOneToAll",
                              "MergePooledEmbeddingsModule", "EmbeddingsAllToOne", "EmbeddingsAllToOneReduce",
                              "SeqEmbeddingsAllToOne", "TensorAllToAll", "TensorAllToAllSplitsAwaitable",
                              "TensorAllToAllValuesAwaitable", "TensorValuesAllToAll", "JaggedTensorAllToAll",
                              "VariableBatchPooledEmbeddingsReduceScatter"],
    "distributed.model_parallel": ["DistributedModelParallel", "DataParallelWrapper", "DefaultDataParallelWrapper",
                                   "DMPCollection"],
    "distributed.train_pipeline": ["TrainPipelineSparseDist", "TrainPipelineBase", "TrainPipeline",
                                   "EvalPipelineSparseDist", "TrainPipelineFusedSparseDist",
                                   "PrefetchTrainPipelineSparseDist", "StagedTrainPipeline", "SparseDataDistUtil",
                                   "StageOut", "GradientAccumulationConfig", "GradientAccumulationWrapper"],
    "distributed.train_pipeline.train_pipelines": ["TrainPipelineSparseDist", "TrainPipelineBase", "TrainPipeline",
                                                   "EvalPipelineSparseDist", "TrainPipelineSemiSync",
                                                   "TrainPipelineFusedSparseDist", "PrefetchTrainPipelineSparseDist",
                                                   "StagedTrainPipeline", "TrainPipelineSparseDistCompAutograd"],
    "distributed.train_pipeline.pipeline_stage": ["PipelineStage", "SparseDataDistUtil", "StageOut"],
    "distributed.train_pipeline.gradient_accumulation": ["GradientAccumulationConfig",
                                                         "GradientAccumulationWrapper"],
    "distributed.sharding_plan": ["construct_module_sharding_plan", "table_wise", "row_wise", "column_wise",
                                  "table_row_wise", "grid_shard", "data_parallel", "apply_to_all",
                                  "get_module_to_default_sharders", "get_default_sharders"],
    "distributed.embeddingbag": ["EmbeddingBagCollectionSharder", "ShardedEmbeddingBagCollection"],
    "distributed.embedding": ["EmbeddingCollectionSharder", "ShardedEmbeddingCollection"],
    "distributed.fp_embeddingbag": ["FeatureProcessedEmbeddingBagCollectionSharder"],
    "distributed.fbgemm_qcomm_codec": ["CommType", "QCommsConfig", "get_qcomm_codecs_registry", "get_qcomm_codecs"],
    "distributed.embedding_types": ["OptimType", "ListOfKJTList", "InputDistOutputs", "ShardedConfig",
                                    "ShardedMetaConfig", "DTensorMetadata", "EmbeddingAttributes",
                                    "ShardedEmbeddingTable", "GroupedEmbeddingConfig", "EmbeddingComputeKernel", "ShardingType", "PoolingType", "DataType",
                                    "ModuleSharder", "ShardMetadata", "KJTList"],
    "distributed.mc_modules": ["ShardedManagedCollisionCollection"],
    "distributed.mc_embeddingbag": ["ShardedManagedCollisionEmbeddingBagCollection",
                                    "ManagedCollisionEmbeddingBagCollectionSharder"],
    "distributed.mc_embedding": ["ShardedManagedCollisionEmbeddingCollection",
                                 "ManagedCollisionEmbeddingCollectionSharder"],
    "distributed.quant_embedding": ["QuantEmbeddingCollectionSharder", "ShardedQuantEmbeddingCollection"],
    "distributed.quant_embeddingbag": ["QuantEmbeddingBagCollectionSharder", "ShardedQuantEmbeddingBagCollection"],
    "optim.keyed": ["CombinedOptimizer", "KeyedOptimizer", "KeyedOptimizerWrapper", "OptimizerWrapper"],
    "optim.warmup": ["WarmupOptimizer", "WarmupStage", "WarmupPolicy"],
    "optim.clipping": ["GradientClippingOptimizer", "GradientClipping"],
    "optim": ["WarmupOptimizer", "GradientClippingOptimizer", "OptimizerWrapper", "CombinedOptimizer",
              "RowWiseAdagrad", "SGD", "Adagrad", "Adam", "LAMB", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB"],
    "optim.optimizers": ["SGD", "Adagrad", "Adam", "LAMB", "LarsSGD", "PartialRowWiseAdam", "PartialRowWiseLAMB",
                         "in_backward_optimizer_filter"],
    "optim.rowwise_adagrad": ["RowWiseAdagrad"],
    "streamable": ["Pipelineable", "Multistreamable"],
    "quant.embedding_modules": ["EmbeddingBagCollection", "EmbeddingCollection"],
    "inference.model_packager": ["PredictFactoryPackager", "load_pickle_config", "load_config_text"],
    "inference.modules": ["quantize_inference_model", "shard_quant_model", "quantize_embeddings", "quantize_feature",
                          "quantize_dense", "trim_torch_package_prefix_from_typename", "DEFAULT_QUANT_MAPPING"],
    "metrics.metrics_namespace": ["MetricName", "MetricNamespace", "MetricPrefix", "compose_metric_key",
                                  "compose_metric_namespace", "compose_customized_metric_key",
                                  "task_wildcard_metrics_pattern"],
    "metrics.deferrable_metrics": ["DeferrableMetrics"],
    "metrics.mae": ["MAEMetric"],
    "metrics.accuracy": ["AccuracyMetric"],
    "metrics.precision": ["PrecisionMetric"],
    "metrics.recall": ["RecallMetric"],
    "metrics.weighted_avg": ["WeightedAvgMetric"],
    "metrics.auprc": ["AUPRCMetric"],
    "metrics.throughput": ["ThroughputMetric"],
    "metrics.ne_positive": ["NEPositiveMetric"],
    "metrics.rauc": ["RAUCMetric"],
    "metrics.gauc": ["GAUCMetric"],
    "metrics.ndcg": ["NDCGMetric"],
    "metrics.metrics_config": ["ThroughputDef", "MetricsConfig", "RecMetricEnum"],
}


# subpackages that `import torchrec` leaves unimported (TorchRec 1.8): code imports them before use
NOT_IMPORTED_BY_THE_PACKAGE = ("metrics", "datasets", "inference", "models")
SUBPACKAGES = ("distributed", "fx", "modules", "optim", "quant", "sparse", "streamable") + NOT_IMPORTED_BY_THE_PACKAGE


def test_import_makes_the_same_subpackages_attributes_as_torchrecs():
    # in a fresh interpreter, so that no other test's imports count: `import torchrec; torchrec.fx.symbolic_trace(m)`
    # must run with the alias; rectoolkit may make more attributes, never fewer
    check = ("import importlib, sys; lib = importlib.import_module(sys.argv[1]); "
             f"print(sorted(n for n in {SUBPACKAGES!r} if hasattr(lib, n)))")
    ours = subprocess.run([sys.executable, "-c", check, "rectoolkit"], capture_output=True, text=True, check=True)
    assert ours.stdout.split() == "['distributed', 'fx', 'modules', 'optim', 'quant', 'sparse', 'streamable']".split()
    if importlib.util.find_spec("torchrec") is not None:
        theirs = subprocess.run([sys.executable, "-c", check, "torchrec"], capture_output=True, text=True, check=True)
        assert theirs.stdout == ours.stdout


@pytest.mark.parametrize("path", sorted(PATHS))
def test_attribute_paths_resolve_to_the_top_level_objects(path):
    if path.split(".")[0] in NOT_IMPORTED_BY_THE_PACKAGE:  # as in TorchRec: `import torchrec.metrics` first
        importlib.import_module(f"rectoolkit.{path.split('.')[0]}")
    module = torchrec_alias
    for part in path.split("."):
        module = getattr(module, part)  # attribute access, as `torchrec.distributed.planner.Topology` does
    for name in PATHS[path]:
        ours = getattr(module, name)
        top = getattr(rectoolkit, name, None)
        if path.startswith("quant."):  # TorchRec's quantized classes share the float ones' names
            assert ours is not top and ours.__name__ == f"Quant{name}", (path, name)
        elif top is not None:
            assert ours is top, (path, name)
        from_import = getattr(importlib.import_module(f"rectoolkit.{path}"), name)
        assert from_import is ours


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_same_paths_exist_in_torchrec(path):
    pytest.importorskip("torchrec")
    module = importlib.import_module(f"torchrec.{path}")
    missing = [name for name in PATHS[path] if not hasattr(module, name)
               and name not in ("ParameterConstraints",)]  # a tutorial's spelling; TorchRec keeps it in planner.types
    if path == "distributed.planner":
        assert hasattr(importlib.import_module("torchrec.distributed.planner.types"), "ParameterConstraints")
    assert not missing, (path, missing)


def test_seed_003_attribute_style_runs():
    # the deep-dive notebook's calls, verbatim apart from the alias
    torchrec = torchrec_alias
    kjt = torchrec.sparse.jagged_tensor.KeyedJaggedTensor.from_lengths_sync(
        keys=["large_features", "small_features"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1, 0]))
    assert kjt["large_features"].values().tolist() == [1, 2]
    sharders = [torchrec.distributed.embeddingbag.EmbeddingBagCollectionSharder()]
    tables = [torchrec.EmbeddingBagConfig(name="large_table", embedding_dim=8, num_embeddings=100,
                                          feature_names=["large_features"]),
              torchrec.EmbeddingBagConfig(name="small_table", embedding_dim=8, num_embeddings=10,
                                          feature_names=["small_features"])]
    model = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    planner = torchrec.distributed.planner.EmbeddingShardingPlanner(
        topology=torchrec.distributed.planner.Topology(world_size=2, compute_device="cuda"),
        constraints={"large_table": torchrec.distributed.types.ParameterConstraints(
            sharding_types=[torchrec.distributed.types.ShardingType.ROW_WISE.value])})
    plan = planner.plan(model, sharders)
    assert plan.get_plan_for_module("")["large_table"].sharding_type == "row_wise"


def test_sharders_answer_for_what_rectoolkit_runs():
    from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder

    bags, sequences = EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()
    assert bags.module_type is rectoolkit.EmbeddingBagCollection
    assert sequences.module_type is rectoolkit.EmbeddingCollection
    assert len(bags.sharding_types("cpu")) == 7 and "grid_shard" not in sequences.sharding_types("cuda")
    assert "table_column_wise" in bags.sharding_types("cpu") and "table_column_wise" not in sequences.sharding_types("cpu")
    assert bags.compute_kernels("data_parallel", "cuda") == ["dense"]
    assert "fused_uvm_caching" in bags.compute_kernels("row_wise", "cuda")
    assert "fused_uvm_caching" not in bags.compute_kernels("row_wise", "cpu")
    with pytest.raises(ValueError, match="'grid_shard' is not supported"):
        sequences.compute_kernels("grid_shard", "cuda")
    with pytest.raises(ValueError, match="'tpu'"):
        bags.sharding_types("tpu")


def test_seed_001_sharding_flow_with_wait_and_lazy_awaitable():
    # the tutorial's calls (one process: ShardingEnv.from_local instead of a process group)
    torchrec = torchrec_alias
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from rectoolkit.distributed.planner import EmbeddingShardingPlanner, Topology
    from rectoolkit.distributed.types import LazyAwaitable, ShardingEnv

    ebc = torchrec.EmbeddingBagCollection(device="meta", tables=[
        torchrec.EmbeddingBagConfig(name=f"{name}_table", embedding_dim=64, num_embeddings=4096, feature_names=[name],
                                    pooling=torchrec.PoolingType.SUM) for name in ("product", "user")])
    sharder = EmbeddingBagCollectionSharder()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).collective_plan(
        ebc, [sharder])
    sharded_ebc = torchrec.DistributedModelParallel(ebc, env=ShardingEnv.from_local(1, 0), plan=plan,
                                                    sharders=[sharder])
    kjt = torchrec.KeyedJaggedTensor(keys=["product", "user"], values=torch.tensor([101, 201, 101, 404, 404, 606]),
                                     lengths=torch.tensor([2, 0, 1, 1, 1, 1]))
    kt = sharded_ebc(kjt).wait()
    assert type(kt) is torchrec.KeyedTensor and kt.keys() == ["product", "user"]
    assert {k: tuple(v.shape) for k, v in kt.to_dict().items()} == {"product": (3, 64), "user": (3, 64)}
    with pytest.raises(ValueError, match=r"from_local\(2, 1\).*process group"):
        ShardingEnv.from_local(2, 1)

    class ExampleAwaitable(LazyAwaitable[torch.Tensor]):
        def __init__(self, size):
            super().__init__()
            self._size = size
            self.calls = 0

        def _wait_impl(self) -> torch.Tensor:
            self.calls += 1
            return torch.ones(self._size)

    awaitable = ExampleAwaitable([3, 2])
    assert torch.equal(awaitable.wait(), torch.ones(3, 2)) and awaitable.wait() is awaitable.wait()
    assert awaitable.calls == 1


@pytest.mark.torchrec
def test_awaitables_and_their_callbacks_behave_as_torchrecs():
    """A custom sharded module's input_dist returns an Awaitable whose callbacks transform the result in order;
    an abstract one cannot be built; a LazyAwaitable is an Awaitable and waits once."""
    theirs = pytest.importorskip("torchrec.distributed.types")
    from rectoolkit.distributed import types as ours

    for lib in (ours, theirs):
        awaitable = lib.NoWait(torch.ones(2))
        awaitable.callbacks.extend([lambda t: t * 3, lambda t: t + 1])
        assert torch.equal(awaitable.wait(), torch.full((2,), 4.0)) and awaitable.wait() is not awaitable.wait()
        with pytest.raises(TypeError, match="abstract"):
            lib.Awaitable()
        lazy = lib.LazyNoWait(torch.ones(2))
        lazy.callbacks.append(lambda t: t * 2)
        assert isinstance(lazy, lib.Awaitable) and torch.equal(lazy + 1, torch.full((2,), 3.0))


def test_planner_honours_sharders_ours_and_torchrecs():
    tables = [rectoolkit.EmbeddingBagConfig(name="big", num_embeddings=100_000, embedding_dim=64, feature_names=["f"]),
              rectoolkit.EmbeddingBagConfig(name="wide", num_embeddings=1000, embedding_dim=256, feature_names=["g"])]
    ebc = rectoolkit.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    only_row_wise = {"big": rectoolkit.ParameterConstraints(sharding_types=["row_wise"])}
    planner = rectoolkit.EmbeddingShardingPlanner(rectoolkit.Topology(world_size=2, compute_device="cpu"),
                                                  constraints=only_row_wise)
    ours = rectoolkit.distributed.embeddingbag.EmbeddingBagCollectionSharder()
    assert planner.plan(ebc, [ours]).get_plan_for_module("")["big"].sharding_type == "row_wise"

    class TableWiseOnly(type(ours)):
        def sharding_types(self, compute_device_type):
            return ["table_wise", "data_parallel"]

    plan = rectoolkit.EmbeddingShardingPlanner(rectoolkit.Topology(world_size=2, compute_device="cpu")).plan(
        ebc, [TableWiseOnly()])
    assert {ps.sharding_type for ps in plan.get_plan_for_module("").values()} <= {"table_wise", "data_parallel"}
    with pytest.raises(ValueError, match=r"'big' allows sharding types \['row_wise'\].*TableWiseOnly"):
        planner.plan(ebc, [TableWiseOnly()])
    assert planner.plan(ebc, [rectoolkit.distributed.embedding.EmbeddingCollectionSharder()]).plan == {}  # as TorchRec

    pytest.importorskip("torchrec")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TorchRecSharder

    # TorchRec runs no row-wise sharding on CPU: with its sharder the plan avoids it, as TorchRec's planner would
    free = rectoolkit.EmbeddingShardingPlanner(rectoolkit.Topology(world_size=2, compute_device="cpu"))
    plan = free.plan(ebc, [TorchRecSharder()])
    cpu_types = set(TorchRecSharder().sharding_types("cpu"))
    assert all(ps.sharding_type in cpu_types for ps in plan.get_plan_for_module("").values())
