"""`RecMetricModule` and `generate_metric_module` at TorchRec's path (`torchrec.metrics.metric_module`): the
metrics of a training job, fed from the model's output dict and computed across ranks.

    >>> from rectoolkit.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum, RecTaskInfo
    >>> task = RecTaskInfo(name="click")
    >>> config = MetricsConfig(rec_tasks=[task], rec_metrics={
    ...     RecMetricEnum.CALIBRATION: RecMetricDef(rec_tasks=[task], window_size=8),
    ...     RecMetricEnum.CTR: RecMetricDef(rec_tasks=[task], window_size=8)})
    >>> module = generate_metric_module(RecMetricModule, config, batch_size=2, world_size=1, my_rank=0,
    ...                                 state_metrics_mapping={}, device=torch.device("cpu"))
    >>> module.update({"prediction": torch.tensor([0.2, 0.4]), "label": torch.tensor([0., 1.]),
    ...                "weight": torch.ones(2)})
    >>> {key: round(float(value), 3) for key, value in sorted(module.compute().items())}
    {'calibration-click|lifetime_calibration': 0.6, 'calibration-click|window_calibration': 0.6, \
'ctr-click|lifetime_ctr': 0.5, 'ctr-click|window_ctr': 0.5}

In a training loop: `module.update(...)` every step, `if module.should_compute(): module.compute()` on every
rank (compute is a collective).
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Optional, Type

import torch
from torch import nn

from rectoolkit.metrics.accuracy import AccuracyMetric
from rectoolkit.metrics.auc import AUCMetric
from rectoolkit.metrics.auprc import AUPRCMetric
from rectoolkit.metrics.cali_free_ne import CaliFreeNEMetric
from rectoolkit.metrics.calibration import CalibrationMetric
from rectoolkit.metrics.calibration_with_recalibration import RecalibratedCalibrationMetric
from rectoolkit.metrics.ctr import CTRMetric
from rectoolkit.metrics.deferrable_metrics import DeferrableMetrics
from rectoolkit.metrics.metrics_config import (MetricsConfig, RecMetricEnum, RecTaskInfo, StateMetricEnum,
                                               validate_batch_size_stages)
from rectoolkit.metrics.metrics_namespace import (MetricNamespace, compose_customized_metric_key,
                                                  compose_metric_namespace)
from rectoolkit.metrics.mae import MAEMetric
from rectoolkit.metrics.ndcg import NDCGMetric, session_ids_to_tensor
from rectoolkit.metrics.mse import MSEMetric
from rectoolkit.metrics.ne import NEMetric
from rectoolkit.metrics.ne_with_recalibration import RecalibratedNEMetric
from rectoolkit.metrics.nmse import NMSEMetric
from rectoolkit.metrics.ne_positive import NEPositiveMetric
from rectoolkit.metrics.precision import PrecisionMetric
from rectoolkit.metrics import pre_compute_states
from rectoolkit.metrics.rauc import RAUCMetric
from rectoolkit.metrics.recall import RecallMetric
from rectoolkit.metrics.segmented_ne import SegmentedNEMetric
from rectoolkit.metrics.serving_calibration import ServingCalibrationMetric
from rectoolkit.metrics.serving_ne import ServingNEMetric
from rectoolkit.metrics.rec_metric import MissingRequiredInputError, RecMetric, RecMetricException, RecMetricList
from rectoolkit.metrics.throughput import ThroughputMetric
from rectoolkit.metrics.unweighted_ne import UnweightedNEMetric
from rectoolkit.metrics.weighted_avg import WeightedAvgMetric
# counting, averaging, session and QPS metrics (imports)
from rectoolkit.metrics.average import AverageMetric
from rectoolkit.metrics.hindsight_target_pr import HindsightTargetPRMetric
from rectoolkit.metrics.multiclass_recall import MulticlassRecallMetric
from rectoolkit.metrics.multi_label_precision import MultiLabelPrecisionMetric
from rectoolkit.metrics.num_missing_labels import NumMissingLabelsMetric
from rectoolkit.metrics.num_positive_samples import NumPositiveSamplesMetric
from rectoolkit.metrics.output import OutputMetric
from rectoolkit.metrics.precision_session import PrecisionSessionMetric
from rectoolkit.metrics.recall_session import RecallSessionMetric
from rectoolkit.metrics.scalar import ScalarMetric
from rectoolkit.metrics.sum_weights import SumWeightsMetric
from rectoolkit.metrics.tensor_weighted_avg import TensorWeightedAvgMetric
from rectoolkit.metrics.tower_qps import TowerQPSMetric
from rectoolkit.metrics.weighted_sum_predictions import WeightedSumPredictionsMetric
from rectoolkit.metrics.xauc import XAUCMetric


REC_METRICS_MAPPING: Dict[RecMetricEnum, Type[RecMetric]] = {
    RecMetricEnum.NE: NEMetric,
    RecMetricEnum.NE_POSITIVE: NEPositiveMetric,
    RecMetricEnum.CTR: CTRMetric,
    RecMetricEnum.AUC: AUCMetric,
    RecMetricEnum.CALIBRATION: CalibrationMetric,
    RecMetricEnum.MSE: MSEMetric,
    RecMetricEnum.MAE: MAEMetric,
    RecMetricEnum.AUPRC: AUPRCMetric,
    RecMetricEnum.ACCURACY: AccuracyMetric,
    RecMetricEnum.PRECISION: PrecisionMetric,
    RecMetricEnum.RECALL: RecallMetric,
    RecMetricEnum.WEIGHTED_AVG: WeightedAvgMetric,
    RecMetricEnum.RAUC: RAUCMetric,
    RecMetricEnum.NDCG: NDCGMetric,
    # counting, averaging, session and QPS metrics
    RecMetricEnum.TOWER_QPS: TowerQPSMetric,
    RecMetricEnum.MULTICLASS_RECALL: MulticlassRecallMetric,
    RecMetricEnum.HINDSIGHT_TARGET_PR: HindsightTargetPRMetric,
    RecMetricEnum.XAUC: XAUCMetric,
    RecMetricEnum.NUM_POSITIVE_SAMPLES: NumPositiveSamplesMetric,
    RecMetricEnum.NUM_MISSING_LABELS: NumMissingLabelsMetric,
    RecMetricEnum.SUM_WEIGHTS: SumWeightsMetric,
    RecMetricEnum.WEIGHTED_SUM_PREDICTIONS: WeightedSumPredictionsMetric,
    RecMetricEnum.AVERAGE: AverageMetric,
    RecMetricEnum.TENSOR_WEIGHTED_AVG: TensorWeightedAvgMetric,
    RecMetricEnum.SCALAR: ScalarMetric,
    RecMetricEnum.OUTPUT: OutputMetric,
    RecMetricEnum.MULTI_LABEL_PRECISION: MultiLabelPrecisionMetric,
    RecMetricEnum.PRECISION_SESSION_LEVEL: PrecisionSessionMetric,
    RecMetricEnum.RECALL_SESSION_LEVEL: RecallSessionMetric,
    RecMetricEnum.RECALIBRATED_NE: RecalibratedNEMetric,
    RecMetricEnum.RECALIBRATED_CALIBRATION: RecalibratedCalibrationMetric,
    RecMetricEnum.CALI_FREE_NE: CaliFreeNEMetric,
    RecMetricEnum.UNWEIGHTED_NE: UnweightedNEMetric,
    RecMetricEnum.NMSE: NMSEMetric,
    RecMetricEnum.SERVING_NE: ServingNEMetric,
    RecMetricEnum.SERVING_CALIBRATION: ServingCalibrationMetric,
    RecMetricEnum.SEGMENTED_NE: SegmentedNEMetric,
}


class StateMetric(abc.ABC):
    """TorchRec's interface of a component that reports its own values (an optimizer's learning rate, ...): a
    RecMetricModule's `state_metrics` {namespace: StateMetric} add `get_metrics()` to compute(), each value under
    `"{namespace}|{name}"`."""

    @abc.abstractmethod
    def get_metrics(self) -> Dict[str, Any]:
        """{name: value} now."""


STATE_METRICS_NAMESPACE_MAPPING: Dict[StateMetricEnum, MetricNamespace] = {
    StateMetricEnum.OPTIMIZERS: MetricNamespace.OPTIMIZERS,
    StateMetricEnum.MODEL_CONFIGURATOR: MetricNamespace.MODEL_CONFIGURATOR,
}


class RecMetricModule(nn.Module):
    """The job's RecMetrics, ThroughputMetric and StateMetrics (TorchRec's constructor). The adaptive compute
    interval (min/max_compute_interval) is not implemented: passing it raises NotImplementedError."""

    def __init__(self, batch_size: int, world_size: int, rec_tasks: Optional[List[RecTaskInfo]] = None,
                 rec_metrics: Optional[RecMetricList] = None, throughput_metric: Optional[ThroughputMetric] = None,
                 state_metrics: Optional[Dict[str, Any]] = None, compute_interval_steps: int = 100,
                 min_compute_interval: float = 0.0, max_compute_interval: float = float("inf")) -> None:
        super().__init__()
        if throughput_metric is not None and not isinstance(throughput_metric, ThroughputMetric):
            raise TypeError(f"RecMetricModule: throughput_metric={throughput_metric!r} is not a ThroughputMetric; "
                            "pass rectoolkit.metrics.throughput.ThroughputMetric(...) or None")
        for namespace, component in (state_metrics or {}).items():
            if not callable(getattr(component, "get_metrics", None)):
                raise TypeError(f"RecMetricModule: state_metrics[{namespace!r}] is a {type(component).__name__}, "
                                "which has no get_metrics(); pass StateMetric objects")
        for name, value, default in (("min_compute_interval", min_compute_interval, 0.0),
                                     ("max_compute_interval", max_compute_interval, float("inf"))):
            if value != default:
                raise NotImplementedError(f"RecMetricModule: {name}={value!r} is not implemented in rectoolkit; "
                                          f"leave it at {default!r}")
        if compute_interval_steps < 1:
            raise ValueError(f"RecMetricModule: compute_interval_steps={compute_interval_steps} must be >= 1")
        self.batch_size, self.world_size = batch_size, world_size
        self.rec_tasks = list(rec_tasks or [])
        self.rec_metrics = rec_metrics if rec_metrics is not None else RecMetricList([])
        self.throughput_metric = throughput_metric
        self.state_metrics: Dict[str, StateMetric] = dict(state_metrics or {})
        self.compute_interval_steps = compute_interval_steps
        self.trained_batches = 0
        self.compute_count = 0
        self._register_load_state_dict_pre_hook(self.load_state_dict_hook)

    def update(self, model_out: Dict[str, Any], **kwargs: Any) -> None:
        """Feed one batch: model_out holds each task's label, prediction and weight under its RecTaskInfo names,
        and the metrics' required inputs (get_required_inputs(), e.g. NDCG's session ids) under theirs, which
        the metrics get as `required_inputs`; the other keywords reach every metric's update (GAUC's
        `num_candidates`), as in TorchRec."""
        if len(self.rec_metrics) and self.rec_tasks:
            labels, predictions, weights = {}, {}, {}
            for task in self.rec_tasks:
                for out, name in ((labels, task.label_name), (predictions, task.prediction_name),
                                  (weights, task.weight_name)):
                    if name not in model_out:
                        raise ValueError(f"RecMetricModule: task {task.name!r} reads {name!r} but the model output "
                                         f"has only {sorted(model_out)}; set the RecTaskInfo's names to these keys")
                    out[task.name] = model_out[name].squeeze()
            required = self.get_required_inputs()
            if required:
                kwargs["required_inputs"] = {name: _required_input(model_out, name, required) for name in required}
            self.rec_metrics.update(predictions=predictions, labels=labels, weights=weights, **kwargs)
        if self.throughput_metric is not None:
            self.throughput_metric.update()
        self.trained_batches += 1

    def get_required_inputs(self) -> Optional[List[str]]:
        """The extra model outputs the metrics read beyond each task's label, prediction and weight (None: none)."""
        return self.rec_metrics.get_required_inputs()

    def should_compute(self) -> bool:
        """True every compute_interval_steps updates."""
        return self.trained_batches % self.compute_interval_steps == 0

    def compute(self) -> DeferrableMetrics:
        """All metrics over all ranks (every rank must call it), then the throughput's, resolved."""
        self.compute_count += 1
        values = self.rec_metrics.compute()
        if self.throughput_metric is not None:
            values.update(self.throughput_metric.compute())
        for namespace, component in self.state_metrics.items():
            values.update({compose_customized_metric_key(namespace, name): value
                           for name, value in component.get_metrics().items()})
        return DeferrableMetrics(values)

    def local_compute(self) -> DeferrableMetrics:
        """All metrics over this rank's updates only, resolved."""
        return DeferrableMetrics(self.rec_metrics.local_compute())

    def reset(self) -> None:
        """Forget every update."""
        self.rec_metrics.reset()

    def sync(self) -> None:
        """Hold all ranks' metric states until unsync() (a collective; see RecMetric.sync)."""
        self.rec_metrics.sync()

    def unsync(self) -> None:
        """Back to this rank's own states after sync()."""
        self.rec_metrics.unsync()

    def async_compute(self) -> DeferrableMetrics:
        """Not supported, as in TorchRec's RecMetricModule (only its CPU-offloaded subclass computes async)."""
        raise RecMetricException("async_compute is not supported in RecMetricModule")

    def get_pre_compute_states(self, pg: Optional[Any] = None) -> pre_compute_states.States:
        """The metrics' lifetime and window sums over all ranks: {namespace: {task: {state: tensor}}} (a
        collective; the same on every rank), and this rank's throughput buffers under
        ``["throughput"]["throughput"]``. ``pg`` must be None or the metrics' own process group."""
        for metric in self.rec_metrics.rec_metrics:
            if pg is not None and pg is not metric._process_group:
                raise ValueError(f"RecMetricModule.get_pre_compute_states: pg={pg!r} is not the process group "
                                 f"{type(metric).__name__} reduces over; pass pg=None (its own group)")
        states = pre_compute_states.get_pre_compute_states(list(self.rec_metrics.rec_metrics))
        if self.throughput_metric is not None:
            states.setdefault(str(ThroughputMetric._namespace), {})[str(ThroughputMetric._metric_name)] = dict(
                self.throughput_metric.named_buffers())
        return states

    def load_pre_compute_states(self, source: pre_compute_states.States) -> None:
        """Load what get_pre_compute_states returned (no collective)."""
        pre_compute_states.load_pre_compute_states(list(self.rec_metrics.rec_metrics), source)
        if self.throughput_metric is not None:
            saved = source[str(ThroughputMetric._namespace)][str(ThroughputMetric._metric_name)]
            for name, buffer in self.throughput_metric.named_buffers():
                buffer.copy_(saved[name])

    def shutdown(self) -> None:
        """Nothing to stop: this module runs no background worker (TorchRec's only logs)."""

    def load_state_dict_hook(self, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
        """Drops a legacy ``<prefix>_trained_batches`` key before loading, as TorchRec's pre-hook."""
        state_dict.pop(f"{prefix}_trained_batches", None)


def _required_input(model_out: Dict[str, Any], name: str, required: List[str]) -> torch.Tensor:
    """One required input from the model output, squeezed as TorchRec's; a list (of session names, say) becomes
    session numbers as TorchRec's session_ids_to_tensor (TorchRec: only when a task's name starts with "ndcg")."""
    if name not in model_out:
        raise MissingRequiredInputError(f"RecMetricModule.update: the metrics read {name!r} from the model output "
                                        f"(required inputs {required}) but it has only {sorted(model_out)}; add "
                                        f"{name!r} to the model output")
    value = model_out[name]
    return session_ids_to_tensor(value) if isinstance(value, list) else value.squeeze()


def _tasks_of(config: MetricsConfig, metric: RecMetricEnum) -> List[RecTaskInfo]:
    definition = config.rec_metrics[metric]
    if bool(definition.rec_tasks) == bool(definition.rec_task_indices):
        raise ValueError(f"generate_metric_module: metric {metric} needs exactly one of RecMetricDef.rec_tasks and "
                         f"RecMetricDef.rec_task_indices")
    return list(definition.rec_tasks) or [config.rec_tasks[i] for i in definition.rec_task_indices]


def _state_metrics(config: MetricsConfig, mapping: Dict[Any, Any]) -> Dict[str, StateMetric]:
    """{"{ns}-{ns}": the StateMetric the mapping gives} per StateMetricEnum of config.state_metrics (TorchRec's keys)."""
    state_metrics = {}
    for member in config.state_metrics:
        if member not in STATE_METRICS_NAMESPACE_MAPPING:
            raise ValueError(f"generate_metric_module: unknown state metric {member!r} in MetricsConfig.state_metrics; "
                             f"use a StateMetricEnum ({[str(m) for m in StateMetricEnum]})")
        if member not in mapping:
            raise KeyError(f"generate_metric_module: MetricsConfig.state_metrics lists {member} but "
                           f"state_metrics_mapping has no StateMetric for it (it has {[str(m) for m in mapping]}); "
                           f"pass state_metrics_mapping={{StateMetricEnum.{member.name}: <your StateMetric>}}")
        namespace = STATE_METRICS_NAMESPACE_MAPPING[member]
        state_metrics[compose_metric_namespace(namespace, str(namespace))] = mapping[member]
    return state_metrics


def generate_metric_module(metric_class: Type[RecMetricModule], metrics_config: MetricsConfig, batch_size: int,
                           world_size: int, my_rank: int, state_metrics_mapping: Dict[Any, Any], device: torch.device,
                           process_group: Optional[Any] = None, batch_size_stages: Optional[List[Any]] = None,
                           module_kwargs: Optional[Dict[str, Any]] = None) -> RecMetricModule:
    """A `metric_class` (RecMetricModule) with one RecMetric per entry of metrics_config.rec_metrics."""
    config = metrics_config
    validate_batch_size_stages(batch_size_stages)
    for name, value, default in (("batch_size_stages", batch_size_stages, None),
                                 ("enable_pt2_compile", config.enable_pt2_compile, False),
                                 ("use_cpu_offloaded_rec_metric_module", config.use_cpu_offloaded_rec_metric_module,
                                  None)):
        if value != default and value:
            raise NotImplementedError(f"generate_metric_module: {name}={value!r} is not implemented in rectoolkit")
    metrics = []
    for metric in config.rec_metrics:
        if metric not in REC_METRICS_MAPPING:
            raise NotImplementedError(f"generate_metric_module: metric {metric} is not implemented; rectoolkit has "
                                      f"{[str(m) for m in REC_METRICS_MAPPING]}")
        metrics.append(REC_METRICS_MAPPING[metric](
            world_size=world_size, my_rank=my_rank, batch_size=batch_size, tasks=_tasks_of(config, metric),
            compute_mode=config.rec_compute_mode, window_size=config.rec_metrics[metric].window_size,
            fused_update_limit=config.fused_update_limit, compute_on_all_ranks=config.compute_on_all_ranks,
            should_validate_update=config.should_validate_update, process_group=process_group,
            **(config.rec_metrics[metric].arguments or {})))
    throughput = None
    if config.throughput_metric:
        throughput = ThroughputMetric(batch_size=batch_size, world_size=world_size,
                                      window_seconds=config.throughput_metric.window_size,
                                      warmup_steps=config.throughput_metric.warmup_steps)
    module = metric_class(batch_size=batch_size, world_size=world_size, rec_tasks=config.rec_tasks,
                          rec_metrics=RecMetricList(metrics), throughput_metric=throughput,
                          state_metrics=_state_metrics(config, state_metrics_mapping),
                          compute_interval_steps=config.compute_interval_steps,
                          min_compute_interval=config.min_compute_interval,
                          max_compute_interval=config.max_compute_interval, **(module_kwargs or {}))
    return module.to(device)


__all__ = ["REC_METRICS_MAPPING", "STATE_METRICS_NAMESPACE_MAPPING", "RecMetricModule", "StateMetric",
           "generate_metric_module"]
