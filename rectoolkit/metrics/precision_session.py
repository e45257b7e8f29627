"""Session-level precision (`torchrec.metrics.precision_session.PrecisionSessionMetric`): of the weight of the
samples among the `top_threshold` highest predictions of their session (see session_level), the share labelled
positive.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo, SessionMetricDef
    >>> task = RecTaskInfo(name="t", session_metric_def=SessionMetricDef(session_var_name="sid", top_threshold=2))
    >>> metric = PrecisionSessionMetric(world_size=1, my_rank=0, batch_size=4, tasks=[task])
    >>> metric.update(predictions={"t": torch.tensor([0.9, 0.2, 0.5, 0.7])}, labels={"t": torch.tensor([1., 1., 0., 1.])},
    ...               weights=None, required_inputs={"sid": torch.tensor([1, 1, 1, 2])})
    >>> round(float(metric.compute()["precision_session_level-t|lifetime_precision_session_level"]), 4)   # 2 of 3
    0.6667
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.session_level import SessionComputation, SessionMetric

NUM_TRUE_POS = "num_true_pos"
NUM_FALSE_POS = "num_false_pos"


class PrecisionSessionMetricComputation(SessionComputation):
    """TorchRec's states `num_true_pos` and `num_false_pos`."""

    _state_names = (NUM_TRUE_POS, NUM_FALSE_POS)
    _metric_name = MetricName.PRECISION_SESSION_LEVEL
    _what = "Precision"

    def _counts(self, labels: torch.Tensor, predicted: torch.Tensor, weights: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        positive = (predicted == 1).double()
        return torch.sum(weights * labels * positive, dim=-1), torch.sum(weights * (1 - labels) * positive, dim=-1)


class PrecisionSessionMetric(SessionMetric):
    """`precision_session_level-{task}|{lifetime,window}_precision_session_level` (TorchRec's constructor; each task
    needs a SessionMetricDef with top_threshold; unfused mode only)."""

    _namespace = MetricNamespace.PRECISION_SESSION_LEVEL
    _computation_class = PrecisionSessionMetricComputation
    _what = "precision"


__all__ = ["PrecisionSessionMetric", "PrecisionSessionMetricComputation"]
