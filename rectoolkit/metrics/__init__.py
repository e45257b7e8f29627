"""Training metrics at TorchRec's paths (`torchrec.metrics`): windowed and lifetime NE, NE of the positives, calibration, CTR, MSE, MAE,
accuracy, precision, recall, weighted average, window AUC, AUPRC and RAUC, session GAUC and NDCG per task, reduced across ranks, and
throughput; `RecMetricModule` holds a job's metrics."""

from rectoolkit.metrics.accuracy import AccuracyMetric
from rectoolkit.metrics.auc import AUCMetric
from rectoolkit.metrics.auprc import AUPRCMetric
from rectoolkit.metrics.cali_free_ne import CaliFreeNEMetric
from rectoolkit.metrics.calibration import CalibrationMetric
from rectoolkit.metrics.calibration_with_recalibration import RecalibratedCalibrationMetric
from rectoolkit.metrics.ctr import CTRMetric
from rectoolkit.metrics.gauc import GAUCMetric
from rectoolkit.metrics import deferrable_metrics, metrics_namespace  # noqa: F401  (TorchRec's paths, for attribute access)
from rectoolkit.metrics.mae import MAEMetric
from rectoolkit.metrics.metric_module import RecMetricModule, generate_metric_module
from rectoolkit.metrics.metrics_config import MetricsConfig, RecComputeMode, RecMetricDef, RecMetricEnum, RecTaskInfo
from rectoolkit.metrics.mse import MSEMetric
from rectoolkit.metrics.ndcg import NDCGMetric
from rectoolkit.metrics.ne import NEMetric
from rectoolkit.metrics.ne_with_recalibration import RecalibratedNEMetric
from rectoolkit.metrics.nmse import NMSEMetric
from rectoolkit.metrics.ne_positive import NEPositiveMetric
from rectoolkit.metrics.precision import PrecisionMetric
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException, RecMetricList
from rectoolkit.metrics.recall import RecallMetric
from rectoolkit.metrics.segmented_ne import SegmentedNEMetric
from rectoolkit.metrics.serving_calibration import ServingCalibrationMetric
from rectoolkit.metrics.serving_ne import ServingNEMetric
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

__all__ = ["AUCMetric", "AUPRCMetric", "AccuracyMetric", "CTRMetric", "CalibrationMetric", "GAUCMetric", "MAEMetric",
           "MSEMetric", "MetricsConfig", "NDCGMetric", "NEMetric", "NEPositiveMetric", "PrecisionMetric",
           "RecComputeMode", "RecMetric", "RecMetricDef", "RecMetricEnum", "RecMetricException", "RecMetricList",
           "RecMetricModule", "RecTaskInfo", "RecallMetric", "WeightedAvgMetric", "generate_metric_module"]
__all__ += ["CaliFreeNEMetric", "NMSEMetric", "RecalibratedCalibrationMetric", "RecalibratedNEMetric",
            "SegmentedNEMetric", "ServingCalibrationMetric", "ServingNEMetric", "UnweightedNEMetric"]
# counting, averaging, session and QPS metrics
__all__ += ["AverageMetric", "HindsightTargetPRMetric", "MulticlassRecallMetric", "NumMissingLabelsMetric",
            "NumPositiveSamplesMetric", "SumWeightsMetric", "TowerQPSMetric", "WeightedSumPredictionsMetric",
            "XAUCMetric"]
__all__ += ["OutputMetric", "ScalarMetric", "TensorWeightedAvgMetric"]
__all__ += ["MultiLabelPrecisionMetric", "PrecisionSessionMetric", "RecallSessionMetric"]
