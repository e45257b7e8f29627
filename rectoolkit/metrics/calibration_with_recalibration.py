"""Calibration after recalibration (`torchrec.metrics.calibration_with_recalibration.RecalibratedCalibrationMetric`):
for a model trained on negatively downsampled data, each prediction p is first mapped back to the full data's
odds with the `recalibration_coefficient` c (the rate negatives were kept at),

    p' = p / (p + (1 - p) / c)

and calibration (see calibration.py) is computed on p'. c = 1 changes nothing. `recalibrate` and
`RecalibratedPredictions` are shared with ne_with_recalibration.py.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = RecalibratedCalibrationMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")],
    ...                                        recalibration_coefficient=0.5)
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5])}, labels={"t": torch.tensor([0., 1.])},
    ...               weights=None)
    >>> round(float(metric.compute()["recalibrated_calibration-t|lifetime_calibration"]), 4)   # 2 * 1/3
    0.6667
"""

from __future__ import annotations

import math
from typing import Any, Dict

import torch

from rectoolkit.metrics.calibration import CalibrationMetric, CalibrationMetricComputation


def recalibrate(predictions: torch.Tensor, coefficient: float) -> torch.Tensor:
    """Predictions of a model trained with negatives kept at rate `coefficient`, mapped to the full data."""
    return predictions / (predictions + (1.0 - predictions) / coefficient)


def check_recalibration_coefficient(owner: str, coefficient: Any) -> float:
    """The coefficient as a float; refuses one that is not a positive finite number."""
    if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or not (
            math.isfinite(coefficient) and coefficient > 0):
        raise ValueError(f"{owner}: recalibration_coefficient={coefficient!r} must be a positive "
                         "finite number (the rate negatives were sampled at in training, e.g. 0.1)")
    return float(coefficient)


def recalibrate_batch(predictions: torch.Tensor, coefficient: float) -> torch.Tensor:
    """TorchRec's computations' recalibration: the coefficient broadcast to a tensor of the predictions' dtype."""
    return recalibrate(predictions, coefficient * torch.ones_like(predictions))


class RecalibratedPredictions:
    """Mixin for a sum-state metric: takes `recalibration_coefficient` (default 1.0, must be a positive finite
    number) and recalibrates each batch's predictions before the metric's own sums."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_recalibration_coefficient(type(self).__name__, self._options["recalibration_coefficient"])

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        recalibrated = recalibrate(predictions, float(self._options["recalibration_coefficient"]))
        return super()._batch_states(recalibrated, labels, weights)


class RecalibratedCalibrationMetricComputation(CalibrationMetricComputation):
    """TorchRec's computation: calibration's states and reports over the recalibrated predictions."""

    def __init__(self, *args: Any, recalibration_coefficient: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._recalibration_coefficient = check_recalibration_coefficient(type(self).__name__,
                                                                          recalibration_coefficient)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return super()._batch_states(recalibrate_batch(predictions, self._recalibration_coefficient), labels, weights)


class RecalibratedCalibrationMetric(RecalibratedPredictions, CalibrationMetric):
    """Lifetime and window calibration of the recalibrated predictions per task
    (`recalibrated_calibration-{task}|{lifetime,window}_calibration`); state_dict as CalibrationMetric's."""

    _namespace = "recalibrated_calibration"
    _options = {"recalibration_coefficient": 1.0}


__all__ = ["RecalibratedCalibrationMetric", "RecalibratedCalibrationMetricComputation", "RecalibratedPredictions",
           "check_recalibration_coefficient", "recalibrate", "recalibrate_batch"]
