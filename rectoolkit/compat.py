"""TorchRec's module paths in rectoolkit: the declared compatibility part.

Code written for TorchRec imports from module paths (`torchrec.distributed.types.ShardingPlan`,
`torchrec.modules.embedding_configs.EmbeddingBagConfig`, ...); with `import rectoolkit as torchrec` those paths
resolve here. Some are rectoolkit's real modules (TORCHREC_NAMED_MODULES: the module TorchRec names is where the
code lives). The others are *path modules* (PATH_MODULES): files that exist only so the path resolves, hold
re-exports and a docstring, and no logic. They are the only modules allowed to import against the layering
(e.g. modules.embedding_configs re-exports quant.config.QuantConfig), so the real packages keep a downward
import graph; tests/viz/test_layering.py checks both rules.

To add a TorchRec path: if no real module sits there, write a path module (a docstring naming the path, the
imports, `__all__`), add it to PATH_MODULES, and add the path and its names to tests/test_torchrec_paths.py.

    >>> import importlib
    >>> all(importlib.import_module(path) for path in PATH_MODULES)
    True
"""

# rectoolkit path -> the TorchRec path it stands for; re-exports only
PATH_MODULES = {
    "rectoolkit.modules.embedding_configs": "torchrec.modules.embedding_configs",
    "rectoolkit.distributed.types": "torchrec.distributed.types",
    "rectoolkit.distributed.embedding_types": "torchrec.distributed.embedding_types",
    "rectoolkit.distributed.planner": "torchrec.distributed.planner",
    "rectoolkit.distributed.planner.types": "torchrec.distributed.planner.types",
    "rectoolkit.distributed.planner.planners": "torchrec.distributed.planner.planners",
    "rectoolkit.distributed.planner.storage_reservations": "torchrec.distributed.planner.storage_reservations",
    "rectoolkit.distributed.planner.stats": "torchrec.distributed.planner.stats",
    "rectoolkit.distributed.planner.constants": "torchrec.distributed.planner.constants",
    "rectoolkit.distributed.planner.utils": "torchrec.distributed.planner.utils",
    "rectoolkit.distributed.embeddingbag": "torchrec.distributed.embeddingbag",
    "rectoolkit.distributed.embedding": "torchrec.distributed.embedding",
    "rectoolkit.distributed.shard": "torchrec.distributed.shard",
    "rectoolkit.distributed.sharding_plan": "torchrec.distributed.sharding_plan",
    "rectoolkit.distributed.quant_embedding": "torchrec.distributed.quant_embedding",
    "rectoolkit.distributed.quant_embeddingbag": "torchrec.distributed.quant_embeddingbag",
    "rectoolkit.distributed.train_pipeline.train_pipelines": "torchrec.distributed.train_pipeline.train_pipelines",
}

# real rectoolkit modules that sit at TorchRec's path
TORCHREC_NAMED_MODULES = {
    "rectoolkit.sparse.jagged_tensor": "torchrec.sparse.jagged_tensor",
    "rectoolkit.sparse.jagged_tensor_validator": "torchrec.sparse.jagged_tensor_validator",
    "rectoolkit.modules.regroup": "torchrec.modules.regroup",
    "rectoolkit.modules.utils": "torchrec.modules.utils",
    "rectoolkit.modules.embedding_modules": "torchrec.modules.embedding_modules",
    "rectoolkit.modules.mc_modules": "torchrec.modules.mc_modules",
    "rectoolkit.modules.mc_embedding_modules": "torchrec.modules.mc_embedding_modules",
    "rectoolkit.distributed.model_parallel": "torchrec.distributed.model_parallel",
    "rectoolkit.distributed.train_pipeline": "torchrec.distributed.train_pipeline",
    "rectoolkit.distributed.fp_embeddingbag": "torchrec.distributed.fp_embeddingbag",
    "rectoolkit.distributed.fbgemm_qcomm_codec": "torchrec.distributed.fbgemm_qcomm_codec",
    "rectoolkit.distributed.comm_ops": "torchrec.distributed.comm_ops",
    "rectoolkit.distributed.utils": "torchrec.distributed.utils",
    "rectoolkit.distributed.collective_utils": "torchrec.distributed.collective_utils",
    "rectoolkit.distributed.dist_data": "torchrec.distributed.dist_data",
    "rectoolkit.distributed.train_pipeline.pipeline_stage": "torchrec.distributed.train_pipeline.pipeline_stage",
    "rectoolkit.distributed.train_pipeline.gradient_accumulation":
        "torchrec.distributed.train_pipeline.gradient_accumulation",
    "rectoolkit.distributed.mc_modules": "torchrec.distributed.mc_modules",
    "rectoolkit.distributed.mc_embeddingbag": "torchrec.distributed.mc_embeddingbag",
    "rectoolkit.distributed.mc_embedding": "torchrec.distributed.mc_embedding",
    "rectoolkit.optim.apply_optimizer_in_backward": "torchrec.optim.apply_optimizer_in_backward",
    "rectoolkit.optim.keyed": "torchrec.optim.keyed",
    "rectoolkit.optim.optimizers": "torchrec.optim.optimizers",
    "rectoolkit.optim.rowwise_adagrad": "torchrec.optim.rowwise_adagrad",
    "rectoolkit.optim.warmup": "torchrec.optim.warmup",
    "rectoolkit.optim.clipping": "torchrec.optim.clipping",
    "rectoolkit.quant.embedding_modules": "torchrec.quant.embedding_modules",
    "rectoolkit.fx": "torchrec.fx",
    "rectoolkit.streamable": "torchrec.streamable",
    "rectoolkit.inference.modules": "torchrec.inference.modules",
    "rectoolkit.datasets.criteo": "torchrec.datasets.criteo",
    "rectoolkit.datasets.movielens": "torchrec.datasets.movielens",
    "rectoolkit.metrics.metric_module": "torchrec.metrics.metric_module",
    "rectoolkit.metrics.deferrable_metrics": "torchrec.metrics.deferrable_metrics",
    "rectoolkit.metrics.metrics_config": "torchrec.metrics.metrics_config",
    "rectoolkit.metrics.metrics_namespace": "torchrec.metrics.metrics_namespace",
    "rectoolkit.metrics.model_utils": "torchrec.metrics.model_utils",
    "rectoolkit.metrics.rec_metric": "torchrec.metrics.rec_metric",
    "rectoolkit.metrics.auc": "torchrec.metrics.auc",
    "rectoolkit.metrics.ne": "torchrec.metrics.ne",
    "rectoolkit.metrics.calibration": "torchrec.metrics.calibration",
    "rectoolkit.metrics.ctr": "torchrec.metrics.ctr",
    "rectoolkit.metrics.mse": "torchrec.metrics.mse",
    "rectoolkit.metrics.mae": "torchrec.metrics.mae",
    "rectoolkit.metrics.accuracy": "torchrec.metrics.accuracy",
    "rectoolkit.metrics.precision": "torchrec.metrics.precision",
    "rectoolkit.metrics.recall": "torchrec.metrics.recall",
    "rectoolkit.metrics.weighted_avg": "torchrec.metrics.weighted_avg",
    "rectoolkit.metrics.auprc": "torchrec.metrics.auprc",
    "rectoolkit.metrics.throughput": "torchrec.metrics.throughput",
    "rectoolkit.metrics.ne_positive": "torchrec.metrics.ne_positive",
    "rectoolkit.metrics.rauc": "torchrec.metrics.rauc",
    "rectoolkit.metrics.gauc": "torchrec.metrics.gauc",
    "rectoolkit.metrics.ndcg": "torchrec.metrics.ndcg",
}
