"""Calibration over serving data (`torchrec.metrics.serving_calibration.ServingCalibrationMetric`): lifetime and
window calibration (see calibration.py) and `total_examples`, the lifetime count of samples with a nonzero weight,
as a long tensor; keys, dtypes and state_dict as TorchRec's (see serving_ne.py).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = ServingCalibrationMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.9])}, labels={"t": torch.tensor([0., 1., 1.])},
    ...               weights={"t": torch.tensor([1., 1., 0.])})
    >>> {key: value.tolist() for key, value in metric.compute().items()}
    {'serving_calibration-t|lifetime_calibration': [1.0], 'serving_calibration-t|window_calibration': [1.0], \
'serving_calibration-t|total_examples': [2]}
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.serving_ne import ServingMetricComputation


class ServingCalibrationMetricComputation(ServingMetricComputation):
    """Calibration's two sums per task, and the served-sample count."""

    _sum_states = ("calibration_num", "calibration_denom")

    def _batch_sums(self, predictions: torch.Tensor, labels: torch.Tensor,
                    weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"calibration_num": (predictions * weights).sum(-1), "calibration_denom": (labels * weights).sum(-1)}

    def _values(self, sums: Dict[str, torch.Tensor]) -> Tuple[MetricName, torch.Tensor]:
        predicted, observed = sums["calibration_num"], sums["calibration_denom"]
        return MetricName.CALIBRATION, torch.where(observed > 0, predicted / observed, 0.0).double()


class ServingCalibrationMetric(RecMetric):
    """Lifetime and window calibration and the served-sample count per task
    (`serving_calibration-{task}|{lifetime,window}_calibration`, `serving_calibration-{task}|total_examples`)."""

    _namespace = "serving_calibration"
    _computation_class = ServingCalibrationMetricComputation


__all__ = ["ServingCalibrationMetric", "ServingCalibrationMetricComputation"]
