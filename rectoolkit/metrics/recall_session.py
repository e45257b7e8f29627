"""Session-level recall (`torchrec.metrics.recall_session.RecallSessionMetric`): of the positive label weight, the
share whose sample is among the `top_threshold` highest predictions of its session (see session_level).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo, SessionMetricDef
    >>> task = RecTaskInfo(name="t", session_metric_def=SessionMetricDef(session_var_name="sid", top_threshold=1))
    >>> metric = RecallSessionMetric(world_size=1, my_rank=0, batch_size=4, tasks=[task])
    >>> metric.update(predictions={"t": torch.tensor([0.9, 0.2, 0.5, 0.7])}, labels={"t": torch.tensor([1., 1., 0., 1.])},
    ...               weights=None, required_inputs={"sid": torch.tensor([1, 1, 1, 2])})
    >>> round(float(metric.compute()["recall_session_level-t|lifetime_recall_session_level"]), 4)   # 2 of 3
    0.6667
"""

from __future__ import annotations

from typing import Tuple

import torch

from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.session_level import SessionComputation, SessionMetric, ranking_within_session

NUM_TRUE_POS = "num_true_pos"
NUM_FALSE_NEGATIVE = "num_false_neg"


class RecallSessionMetricComputation(SessionComputation):
    """TorchRec's states `num_true_pos` and `num_false_neg`."""

    _state_names = (NUM_TRUE_POS, NUM_FALSE_NEGATIVE)
    _metric_name = MetricName.RECALL_SESSION_LEVEL
    _what = "Recall"

    def _counts(self, labels: torch.Tensor, predicted: torch.Tensor, weights: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        return (torch.sum(weights * labels * (predicted == 1).double(), dim=-1),
                torch.sum(weights * labels * (predicted == 0).double(), dim=-1))


class RecallSessionMetric(SessionMetric):
    """`recall_session_level-{task}|{lifetime,window}_recall_session_level` (TorchRec's constructor; each task needs
    a SessionMetricDef with top_threshold; unfused mode only)."""

    _namespace = MetricNamespace.RECALL_SESSION_LEVEL
    _computation_class = RecallSessionMetricComputation
    _what = "recall"


__all__ = ["RecallSessionMetric", "RecallSessionMetricComputation", "ranking_within_session"]
