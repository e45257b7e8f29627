"""Unweighted NE (`torchrec.metrics.unweighted_ne.UnweightedNEMetric`): NE (see ne.py) with every sample's weight
taken as 1, whatever weights are given; `weighted_num_samples` is then the sample count.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = UnweightedNEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5])}, labels={"t": torch.tensor([0., 1.])},
    ...               weights={"t": torch.tensor([9., 0.])})
    >>> float(metric.compute()["unweighted_ne-t|lifetime_unweighted_ne"])   # the weights do not count
    1.0
"""

from __future__ import annotations

from typing import Dict

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.ne import (ETA, NE_STATES, EntropyComputation, NEMetric, compute_cross_entropy, get_ne_states,
                                   normalized_entropy, task_entropy)


def compute_ne(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
               neg_labels: torch.Tensor, eta: float, allow_missing_label_with_zero_weight: bool = False) -> torch.Tensor:
    """`torchrec.metrics.unweighted_ne.compute_ne`: as ne.compute_ne, but with allow_missing_label_with_zero_weight
    and a task without samples, TorchRec's `torch.tensor([eta])` (one float32 value for all tasks)."""
    if allow_missing_label_with_zero_weight and not weighted_num_samples.all():
        return torch.tensor([eta])
    return normalized_entropy(ce_sum, weighted_num_samples.double(), pos_labels, neg_labels, eta)


def get_unweighted_ne_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                             eta: float) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.unweighted_ne.get_unweighted_ne_states`: NE's sums with every weight 1 (weights ignored)."""
    return get_ne_states(labels, predictions, torch.ones_like(labels), eta)


class UnweightedNEMetricComputation(EntropyComputation):
    """TorchRec's computation: NE's states over unit weights (the weights ignored, but required as TorchRec's),
    reports `unweighted_ne`."""

    _state_names = NE_STATES
    _metric_name = MetricName.UNWEIGHTED_NE
    _get_states = staticmethod(get_unweighted_ne_states)
    _compute_value = staticmethod(compute_ne)


class UnweightedNEMetric(NEMetric):
    """Lifetime and window unweighted NE per task (`unweighted_ne-{task}|{lifetime,window}_unweighted_ne`);
    state_dict as NEMetric's.

    Option: allow_missing_label_with_zero_weight (1e-12 instead of nan while a task has no sample; per task here,
    where TorchRec's fused modes report 1e-12 for the first task only, once any task has none).
    """

    _namespace = "unweighted_ne"
    _options = {"allow_missing_label_with_zero_weight": False}
    _report_groups = ()

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_unweighted_ne_states(labels, predictions, weights, ETA)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"unweighted_ne": task_entropy(compute_ne, states, self._options["allow_missing_label_with_zero_weight"])}


__all__ = ["UnweightedNEMetric", "UnweightedNEMetricComputation", "compute_cross_entropy", "compute_ne", "get_unweighted_ne_states"]
