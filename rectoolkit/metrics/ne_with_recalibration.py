"""NE after recalibration (`torchrec.metrics.ne_with_recalibration.RecalibratedNEMetric`): NE (see ne.py) of the
predictions mapped back from negatively downsampled training data, p' = p / (p + (1 - p) / c) with
c = `recalibration_coefficient` (see calibration_with_recalibration.py).

TorchRec 1.8's RecalibratedNEMetric takes include_logloss and allow_missing_label_with_zero_weight but its NE
computation resets both to False, so it never reports logloss; rectoolkit refuses them set to True rather than
ignore them.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = RecalibratedNEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")],
    ...                               recalibration_coefficient=1.0)
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5])}, labels={"t": torch.tensor([0., 1.])},
    ...               weights=None)
    >>> float(metric.compute()["recalibrated_ne-t|lifetime_ne"])   # c = 1: plain NE
    1.0
"""

from __future__ import annotations

from typing import Any, Dict

import torch

from rectoolkit.metrics.calibration_with_recalibration import (RecalibratedPredictions, check_recalibration_coefficient,
                                                               recalibrate_batch)
from rectoolkit.metrics.ne import NEMetric, NEMetricComputation

_IGNORED_BY_TORCHREC = ("include_logloss", "allow_missing_label_with_zero_weight")


def _refuse_ignored_options(owner: str, options: Dict[str, Any]) -> None:
    for option in _IGNORED_BY_TORCHREC:
        if options.get(option):
            raise ValueError(f"{owner}: {option}=True is not supported: TorchRec 1.8's RecalibratedNEMetric ignores "
                             f"it (it reports NE only); pass {option}=False, or use NEMetric for {option}")


class RecalibratedNEMetricComputation(NEMetricComputation):
    """TorchRec's computation: NE's states and `ne` reports over the recalibrated predictions (include_logloss and
    allow_missing_label_with_zero_weight, which TorchRec's ignores, refused when True)."""

    def __init__(self, *args: Any, include_logloss: bool = False, allow_missing_label_with_zero_weight: bool = False,
                 recalibration_coefficient: float = 1.0, **kwargs: Any) -> None:
        _refuse_ignored_options(type(self).__name__, {"include_logloss": include_logloss,
                                                      "allow_missing_label_with_zero_weight":
                                                          allow_missing_label_with_zero_weight})
        super().__init__(*args, **kwargs)
        self._recalibration_coefficient = check_recalibration_coefficient(type(self).__name__,
                                                                          recalibration_coefficient)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return super()._batch_states(recalibrate_batch(predictions, self._recalibration_coefficient), labels, weights)


class RecalibratedNEMetric(RecalibratedPredictions, NEMetric):
    """Lifetime and window NE of the recalibrated predictions per task
    (`recalibrated_ne-{task}|{lifetime,window}_ne`); state_dict as NEMetric's."""

    _namespace = "recalibrated_ne"
    _options = {"recalibration_coefficient": 1.0, "include_logloss": False,
                "allow_missing_label_with_zero_weight": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _refuse_ignored_options(type(self).__name__, self._options)


__all__ = ["RecalibratedNEMetric", "RecalibratedNEMetricComputation"]
