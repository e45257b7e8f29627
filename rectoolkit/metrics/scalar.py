"""A logged scalar (`torchrec.metrics.scalar.ScalarMetric`): whatever value the model gives as the label, per task.
The lifetime value is the latest update's mean label; the window value the mean of the latest updates' means.

As TorchRec's, its states are not saved (the state_dict is empty), the ranks' values are averaged, and an update
counts `labels.shape[0]` samples in the window (one per update unfused, n_tasks fused).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = ScalarMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="lr")])
    >>> for value in (1.0, 3.0):
    ...     metric.update(predictions={"lr": torch.zeros(2)}, labels={"lr": torch.full((2,), value)}, weights=None)
    >>> {key: value.tolist() for key, value in metric.compute().items()}
    {'scalar-lr|lifetime_scalar': [3.0], 'scalar-lr|window_scalar': [2.0]}
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetric


class ScalarMetricComputation(RecMetricComputation):
    """TorchRec's states `labels` (the latest mean label) and `window_count`, with window states, averaged over the
    ranks and not persistent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("labels", "window_count"):
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="mean", persistent=False)

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        num_samples = labels.shape[0]
        states = {"labels": labels.mean(dim=-1),
                  "window_count": torch.ones(self._n_tasks, device=labels.device, dtype=torch.double)}
        for name, value in states.items():
            setattr(self, name, value)
            self._aggregate_window_state(name, value, num_samples)

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.SCALAR, MetricPrefix.LIFETIME, self.labels),
                MetricComputationReport(MetricName.SCALAR, MetricPrefix.WINDOW,
                                        self.get_window_state("labels") / self.get_window_state("window_count"))]


class ScalarMetric(RecMetric):
    """`scalar-{task}|{lifetime,window}_scalar` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.SCALAR
    _computation_class = ScalarMetricComputation


__all__ = ["ScalarMetric", "ScalarMetricComputation"]
