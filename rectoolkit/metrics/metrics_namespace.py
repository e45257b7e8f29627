"""The names in a metric's key, at TorchRec's path (`torchrec.metrics.metrics_namespace`): a key is
`"{namespace}-{task}|{prefix}{name}"`, e.g. `"ne-click|window_ne"`; `compose_metric_key` builds it, so code that
reads `RecMetricModule.compute()` by key needs no hand-written strings.

    >>> compose_metric_key(MetricNamespace.NE, "click", MetricName.NE, MetricPrefix.WINDOW)
    'ne-click|window_ne'
    >>> import re
    >>> bool(re.match(task_wildcard_metrics_pattern(MetricNamespace.CTR, MetricName.CTR, MetricPrefix.LIFETIME),
    ...               "ctr-like|lifetime_ctr"))
    True

The enums hold the names of the metrics rectoolkit computes (NE with logloss, NE of the positives, AUC, AUPRC, calibration, CTR, MSE
with RMSE and R squared, MAE, accuracy, precision, recall, weighted average, throughput with its example
counts, RAUC, GAUC with its session count, NDCG), with TorchRec's values; TorchRec's other members name metrics rectoolkit does not have.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional


class StrValueMixin:
    """str(member) is its value, as in TorchRec."""

    def __str__(self) -> str:
        return self.value


class MetricNameBase(StrValueMixin, Enum):
    pass


class MetricNamespaceBase(StrValueMixin, Enum):
    pass


# every metric here names its namespace too; NE, MSE, GAUC and throughput report more values under theirs
_METRICS = {"NE": "ne", "CTR": "ctr", "CALIBRATION": "calibration", "MSE": "mse", "AUC": "auc", "MAE": "mae",
            "AUPRC": "auprc", "ACCURACY": "accuracy", "PRECISION": "precision", "RECALL": "recall",
            "WEIGHTED_AVG": "weighted_avg", "THROUGHPUT": "throughput", "NE_POSITIVE": "ne_positive",
            "RAUC": "rauc", "GAUC": "gauc", "NDCG": "ndcg"}
# the counting, averaging, session and QPS metrics (namespace and name alike; tower QPS's is "qps")
_METRICS.update({"TOWER_QPS": "qps", "MULTICLASS_RECALL": "multiclass_recall", "HINDSIGHT_TARGET_PR": "hindsight_target_pr",
                 "XAUC": "xauc", "NUM_POSITIVE_SAMPLES": "num_positive_samples",
                 "NUM_MISSING_LABELS": "num_missing_labels", "SUM_WEIGHTS": "sum_weights",
                 "WEIGHTED_SUM_PREDICTIONS": "weighted_sum_predictions",
                 "TENSOR_WEIGHTED_AVG": "tensor_weighted_avg", "SCALAR": "scalar", "OUTPUT": "output",
                 "MULTI_LABEL_PRECISION": "multi_label_precision", "PRECISION_SESSION_LEVEL": "precision_session_level",
                 "RECALL_SESSION_LEVEL": "recall_session_level"})
_NAMESPACES_ONLY = {"AVERAGE": "average"}  # its values are named label_average, prediction_average, ...
# names that are no namespace of their own
_NAMES_ONLY = {"HINDSIGHT_TARGET_PRECISION": "hindsight_target_precision",
               "HINDSIGHT_TARGET_RECALL": "hindsight_target_recall", "DATA_LABEL_AVERAGE": "data_label_average",
               "LABEL_AVERAGE": "label_average", "PREDICTION_AVERAGE": "prediction_average"}
# the NE / calibration family (the recalibrated metrics are namespaces only, NRMSE a name only)
_METRICS.update({"SEGMENTED_NE": "segmented_ne", "SERVING_NE": "serving_ne", "SERVING_CALIBRATION": "serving_calibration",
                 "CALI_FREE_NE": "cali_free_ne", "UNWEIGHTED_NE": "unweighted_ne", "NMSE": "nmse"})
_NAMESPACES_ONLY.update({"RECALIBRATED_NE": "recalibrated_ne", "RECALIBRATED_CALIBRATION": "recalibrated_calibration"})
_NAMES_ONLY.update({"NRMSE": "nrmse"})
# the state metrics' namespaces (RecMetricModule's state_metrics: an optimizer's, a model configurator's values)
_NAMESPACES_ONLY.update({"OPTIMIZERS": "optimizers", "MODEL_CONFIGURATOR": "model_configurator"})
MetricNamespace = MetricNamespaceBase("MetricNamespace", {"DEFAULT": "", **_METRICS, **_NAMESPACES_ONLY},
                                     module=__name__)
MetricName = MetricNameBase("MetricName", {"DEFAULT": "", **_METRICS, "LOG_LOSS": "logloss", "RMSE": "rmse",
                                           "R_SQUARED": "r_squared", "TOTAL_EXAMPLES": "total_examples",
                                           "GAUC_NUM_SAMPLES": "gauc_num_samples",
                                           "ATTEMPT_EXAMPLES": "attempt_examples", "BATCH_SIZE": "batch_size", **_NAMES_ONLY},
                            module=__name__)


class MetricPrefix(StrValueMixin, Enum):
    DEFAULT = ""
    LIFETIME = "lifetime_"
    WINDOW = "window_"
    ATTEMPT = "attempt_"


def task_wildcard_metrics_pattern(namespace: MetricNamespaceBase, metric_name: MetricNameBase,
                                  metric_prefix: MetricPrefix = MetricPrefix.DEFAULT) -> str:
    """A regular expression for one metric's keys, whatever the task."""
    return rf"{namespace}-.+\|{metric_prefix}{metric_name}"


def compose_metric_namespace(namespace: MetricNamespaceBase, task_name: str) -> str:
    """The part of a key before the "|": `"ne-click"`."""
    return f"{namespace}-{task_name}"


def compose_customized_metric_key(namespace: str, metric_name: str, description: Optional[str] = None) -> str:
    """A key from plain strings: `"{namespace}|{metric_name}{description}"`."""
    return f"{namespace}|{metric_name}{description or ''}"


def compose_metric_key(namespace: MetricNamespaceBase, task_name: str, metric_name: MetricNameBase,
                       metric_prefix: MetricPrefix = MetricPrefix.DEFAULT, description: Optional[str] = None) -> str:
    """The key `RecMetricModule.compute()` gives a task's metric."""
    return compose_customized_metric_key(compose_metric_namespace(namespace, task_name),
                                         f"{metric_prefix}{metric_name}", description)


__all__ = ["MetricName", "MetricNameBase", "MetricNamespace", "MetricNamespaceBase", "MetricPrefix", "StrValueMixin",
           "compose_customized_metric_key", "compose_metric_key", "compose_metric_namespace",
           "task_wildcard_metrics_pattern"]
