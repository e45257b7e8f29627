"""Training metrics at TorchRec's paths (`torchrec.metrics`): windowed and lifetime NE, calibration, CTR, MSE
and window AUC per task, reduced across ranks; `RecMetricModule` holds a job's metrics."""

from rectoolkit.metrics.auc import AUCMetric
from rectoolkit.metrics.calibration import CalibrationMetric
from rectoolkit.metrics.ctr import CTRMetric
from rectoolkit.metrics import deferrable_metrics, metrics_namespace  # noqa: F401  (TorchRec's paths, for attribute access)
from rectoolkit.metrics.metric_module import RecMetricModule, generate_metric_module
from rectoolkit.metrics.metrics_config import MetricsConfig, RecComputeMode, RecMetricDef, RecMetricEnum, RecTaskInfo
from rectoolkit.metrics.mse import MSEMetric
from rectoolkit.metrics.ne import NEMetric
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException, RecMetricList

__all__ = ["AUCMetric", "CTRMetric", "CalibrationMetric", "MSEMetric", "MetricsConfig", "NEMetric", "RecComputeMode",
           "RecMetric", "RecMetricDef", "RecMetricEnum", "RecMetricException", "RecMetricList", "RecMetricModule",
           "RecTaskInfo", "generate_metric_module"]
