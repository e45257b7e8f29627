"""What a metric module computes, at TorchRec's path (`torchrec.metrics.metrics_config`): the tasks
(`RecTaskInfo`: which model outputs are a task's labels, predictions and weights), the metrics (`RecMetricEnum`
-> `RecMetricDef`: tasks and window size) and `MetricsConfig`, which `generate_metric_module` turns into a
`RecMetricModule`.

    >>> task = RecTaskInfo(name="click")
    >>> config = MetricsConfig(rec_tasks=[task], rec_metrics={
    ...     RecMetricEnum.NE: RecMetricDef(rec_task_indices=[0], window_size=1024)})
    >>> str(RecMetricEnum.NE), config.rec_metrics[RecMetricEnum.NE].window_size
    ('ne', 1024)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from rectoolkit.metrics.metrics_namespace import StrValueMixin

_DEFAULT_WINDOW_SIZE = 10_000_000
_DEFAULT_THROUGHPUT_WINDOW_SECONDS = 100
_DEFAULT_THROUGHPUT_WARMUP_STEPS = 100


class RecMetricEnumBase(StrValueMixin, Enum):
    """TorchRec's base of metric enums (str() is the value); RecMetricEnum is one."""


class RecMetricEnum(RecMetricEnumBase):
    """The metrics rectoolkit computes, with TorchRec's values (its other members are not implemented here).
    GAUCMetric has no member, as in TorchRec 1.8: build it directly and put it in a RecMetricList."""

    NE = "ne"
    NE_POSITIVE = "ne_positive"
    CTR = "ctr"
    AUC = "auc"
    CALIBRATION = "calibration"
    MSE = "mse"
    MAE = "mae"
    AUPRC = "auprc"
    ACCURACY = "accuracy"
    PRECISION = "precision"
    RECALL = "recall"
    WEIGHTED_AVG = "weighted_avg"
    RAUC = "rauc"
    NDCG = "ndcg"
    # counting, averaging, session and QPS metrics
    TOWER_QPS = "tower_qps"
    MULTICLASS_RECALL = "multiclass_recall"
    HINDSIGHT_TARGET_PR = "hindsight_target_pr"
    XAUC = "xauc"
    NUM_POSITIVE_SAMPLES = "num_positive_samples"
    NUM_MISSING_LABELS = "num_missing_labels"
    SUM_WEIGHTS = "sum_weights"
    WEIGHTED_SUM_PREDICTIONS = "weighted_sum_predictions"
    AVERAGE = "average"
    TENSOR_WEIGHTED_AVG = "tensor_weighted_avg"
    SCALAR = "scalar"
    OUTPUT = "output"
    MULTI_LABEL_PRECISION = "multi_label_precision"
    PRECISION_SESSION_LEVEL = "precision_session_level"
    RECALL_SESSION_LEVEL = "recall_session_level"
    RECALIBRATED_NE = "recalibrated_ne"
    RECALIBRATED_CALIBRATION = "recalibrated_calibration"
    CALI_FREE_NE = "cali_free_ne"
    UNWEIGHTED_NE = "unweighted_ne"
    NMSE = "nmse"
    SERVING_NE = "serving_ne"
    SERVING_CALIBRATION = "serving_calibration"
    SEGMENTED_NE = "segmented_ne"


class RecComputeMode(Enum):
    """TorchRec's modes: fused (all tasks in one [n_tasks, batch] computation) or one computation per task.
    They give the same numbers; here they differ only in the shape of compute()'s values (as in TorchRec)."""

    FUSED_TASKS_COMPUTATION = 1
    UNFUSED_TASKS_COMPUTATION = 2
    FUSED_TASKS_AND_STATES_COMPUTATION = 3


@dataclass(unsafe_hash=True, eq=True)
class SessionMetricDef:
    """How the session-level precision and recall read a task: `session_var_name`, the model output holding each
    sample's session id; `top_threshold`, how many top-ranked predictions of a session count as predicted positive
    (required by those metrics); `run_ranking_of_labels`, rank the labels too (the top ones are the positives)."""

    session_var_name: str
    top_threshold: Optional[int] = None
    run_ranking_of_labels: bool = False


@dataclass(unsafe_hash=True, eq=True)
class RecTaskInfo:
    """One task: its name (in the metric keys) and the model-output names of its label, prediction and weight.

    TorchRec's other fields are accepted: NDCGMetric reads `is_negative_task` (it ranks 1 - prediction by
    1 - label), TensorWeightedAvgMetric `tensor_name` (the model output it averages) and `weighted`, as TorchRec's;
    `session_metric_def` (a SessionMetricDef) by the session-level precision and recall.
    """

    name: str = "DefaultTask"
    label_name: str = "label"
    prediction_name: str = "prediction"
    weight_name: str = "weight"
    session_metric_def: Optional[Any] = None
    is_negative_task: bool = False
    tensor_name: Optional[str] = None
    weighted: bool = True


@dataclass
class RecMetricDef:
    """One metric: its tasks (given, or as indices into MetricsConfig.rec_tasks; exactly one of the two) and
    its window in samples over all ranks (each rank keeps ceil(window_size / world_size) samples)."""

    rec_tasks: List[RecTaskInfo] = field(default_factory=list)
    rec_task_indices: List[int] = field(default_factory=list)
    window_size: int = _DEFAULT_WINDOW_SIZE
    arguments: Optional[Dict[str, Any]] = None


class StateMetricEnum(StrValueMixin, Enum):
    """The state metrics a MetricsConfig can list (`state_metrics`): generate_metric_module takes the StateMetric of
    each from its `state_metrics_mapping` and reports its values under the member's namespace."""

    OPTIMIZERS = "optimizers"
    MODEL_CONFIGURATOR = "model_configurator"


@dataclass
class ThroughputDef:
    """The ThroughputMetric of a MetricsConfig: its window in seconds and its untimed warm-up steps."""

    window_size: int = _DEFAULT_THROUGHPUT_WINDOW_SECONDS
    warmup_steps: int = _DEFAULT_THROUGHPUT_WARMUP_STEPS


@dataclass
class MetricsConfig:
    """All the metrics of a `RecMetricModule` (TorchRec's fields; those rectoolkit does not implement refuse a
    value other than their default when the module is generated)."""

    rec_tasks: List[RecTaskInfo] = field(default_factory=list)
    rec_metrics: Dict[RecMetricEnum, RecMetricDef] = field(default_factory=dict)
    throughput_metric: Optional[ThroughputDef] = None
    rec_compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION
    fused_update_limit: int = 0
    state_metrics: List[Any] = field(default_factory=list)
    compute_interval_steps: int = 100
    min_compute_interval: float = 0.0
    max_compute_interval: float = float("inf")
    compute_on_all_ranks: bool = False
    should_validate_update: bool = False
    enable_pt2_compile: bool = False
    should_clone_update_inputs: bool = False
    use_cpu_offloaded_rec_metric_module: Optional[bool] = None

    def __post_init__(self) -> None:
        for metric, definition in self.rec_metrics.items():
            for index in definition.rec_task_indices:
                if not 0 <= index < len(self.rec_tasks):
                    raise ValueError(f"MetricsConfig: metric {metric} names task index {index} but there are "
                                     f"{len(self.rec_tasks)} rec_tasks; use an index in [0, {len(self.rec_tasks)})")


DefaultTaskInfo = RecTaskInfo()

# TorchRec's two ready-made configs: NE of DefaultTaskInfo with throughput, and nothing (shared objects, as TorchRec's)
DefaultMetricsConfig = MetricsConfig(
    rec_tasks=[DefaultTaskInfo],
    rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_tasks=[DefaultTaskInfo], window_size=_DEFAULT_WINDOW_SIZE)},
    throughput_metric=ThroughputDef(), state_metrics=[])
EmptyMetricsConfig = MetricsConfig(rec_tasks=[], rec_metrics={}, throughput_metric=None, state_metrics=[])


@dataclass
class BatchSizeStage:
    """One stage of a variable batch size (TorchRec's, for TowerQPSMetric / ThroughputMetric): `batch_size` while
    the train iteration is at most `max_iters` (absolute, after the previous stage's), None for the last stage."""

    batch_size: int = 0
    max_iters: Optional[int] = 0


def validate_batch_size_stages(batch_size_stages: Optional[List[BatchSizeStage]]) -> None:
    """TorchRec's check: None or [] pass; otherwise the last stage must have max_iters None.

        >>> validate_batch_size_stages([BatchSizeStage(256, 100), BatchSizeStage(512, 200)])
        Traceback (most recent call last):
        ...
        ValueError: Batch size stages last stage should have max_iters = None, but get 200 (stage 1 of 2, \
batch_size 512); make the last stage BatchSizeStage(batch_size=512, max_iters=None)
    """
    if not batch_size_stages:
        return
    last = batch_size_stages[-1]
    if last.max_iters is not None:
        raise ValueError(f"Batch size stages last stage should have max_iters = None, but get {last.max_iters} "
                         f"(stage {len(batch_size_stages) - 1} of {len(batch_size_stages)}, batch_size "
                         f"{last.batch_size}); make the last stage BatchSizeStage(batch_size={last.batch_size}, "
                         "max_iters=None)")

__all__ = ["BatchSizeStage", "DefaultMetricsConfig", "DefaultTaskInfo", "EmptyMetricsConfig", "MetricsConfig", "RecComputeMode", "RecMetricDef", "RecMetricEnum",
           "RecMetricEnumBase", "RecTaskInfo", "SessionMetricDef", "StateMetricEnum", "ThroughputDef",
           "validate_batch_size_stages"]
