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

from typing import Any

import torch  # noqa: F401  (the doctest's)

from rectoolkit.metrics.calibration_with_recalibration import RecalibratedPredictions
from rectoolkit.metrics.ne import NEMetric


class RecalibratedNEMetric(RecalibratedPredictions, NEMetric):
    """Lifetime and window NE of the recalibrated predictions per task
    (`recalibrated_ne-{task}|{lifetime,window}_ne`); state_dict as NEMetric's."""

    _namespace = "recalibrated_ne"
    _options = {"recalibration_coefficient": 1.0, "include_logloss": False,
                "allow_missing_label_with_zero_weight": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for option in ("include_logloss", "allow_missing_label_with_zero_weight"):
            if self._options[option]:
                raise ValueError(f"RecalibratedNEMetric: {option}=True is not supported: TorchRec 1.8's "
                                 f"RecalibratedNEMetric ignores it (it reports NE only); pass {option}=False, or "
                                 f"use NEMetric for {option}")


__all__ = ["RecalibratedNEMetric"]
