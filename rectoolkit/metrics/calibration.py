"""Calibration (`torchrec.metrics.calibration.CalibrationMetric`): the weighted sum of predictions over the
weighted sum of labels; 1 when the model predicts as many clicks as there are (0 while no label is positive).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = CalibrationMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.3, 0.9])}, labels={"t": torch.tensor([0., 1.])},
    ...               weights=None)
    >>> round(float(metric.compute()["calibration-t|window_calibration"]), 3)
    1.2
"""

from __future__ import annotations

from typing import Dict

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import SumStateMetric, ratio_or_zero
from rectoolkit.metrics.sum_states import OneValueComputation


def compute_calibration(calibration_num: torch.Tensor, calibration_denom: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.calibration.compute_calibration`: per-task calibration (float64), 0 where the weighted
    label sum is not positive."""
    return ratio_or_zero(calibration_num, calibration_denom, calibration_denom <= 0.0)


def get_calibration_states(labels: torch.Tensor, predictions: torch.Tensor,
                           weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.calibration.get_calibration_states`: a batch's sums over the last dim."""
    return {"calibration_num": torch.sum(predictions * weights, dim=-1),
            "calibration_denom": torch.sum(labels * weights, dim=-1)}


class CalibrationMetricComputation(OneValueComputation):
    """TorchRec's calibration computation: states `calibration_num`, `calibration_denom` (float64, with windows),
    reports `calibration`."""

    _state_names = ("calibration_num", "calibration_denom")
    _weights_required = True
    _metric_name = MetricName.CALIBRATION
    _get_states = staticmethod(get_calibration_states)
    _compute_value = staticmethod(compute_calibration)


class CalibrationMetric(SumStateMetric):
    """Lifetime and window calibration per task (`calibration-{task}|{lifetime,window}_calibration`)."""

    _namespace = "calibration"
    _state_names = CalibrationMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_calibration_states(labels, predictions, weights)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"calibration": compute_calibration(*states)}


__all__ = ["CalibrationMetric", "CalibrationMetricComputation", "compute_calibration", "get_calibration_states"]
