"""Calibration-free NE (`torchrec.metrics.cali_free_ne.CaliFreeNEMetric`): NE (see ne.py) divided by the NE of
always predicting the model's own mean prediction, so a miscalibrated model is not penalised for its calibration:

    cali_free_ne = NE / (-P log2(q) - (W - P) log2(1 - q)),  q = sum_i w_i p_i / W,  W = sum w, P = sum w y

(q unclamped, as TorchRec's). States: NE's four sums and `weighted_sum_predictions`.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = CaliFreeNEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5])}, labels={"t": torch.tensor([0., 1.])},
    ...               weights=None)
    >>> float(metric.compute()["cali_free_ne-t|lifetime_cali_free_ne"])   # NE 1 over 2 bits
    0.5
"""

from __future__ import annotations

from typing import Dict

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.ne import (ETA, NE_STATES, EntropyComputation, NEMetric, compute_cross_entropy, get_ne_states,
                                   normalized_entropy, task_entropy)


def compute_cali_free_ne(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
                         neg_labels: torch.Tensor, weighted_sum_predictions: torch.Tensor, eta: float,
                         allow_missing_label_with_zero_weight: bool = False) -> torch.Tensor:
    """`torchrec.metrics.cali_free_ne.compute_cali_free_ne`: NE over the entropy of predicting the mean
    prediction; with allow_missing_label_with_zero_weight and a task without weight, TorchRec's
    `torch.tensor([eta])` (one float32 value for all tasks)."""
    if allow_missing_label_with_zero_weight and not weighted_num_samples.all():
        return torch.tensor([eta])
    ne = normalized_entropy(ce_sum, weighted_num_samples.double(), pos_labels, neg_labels, eta)
    mean_prediction = weighted_sum_predictions / weighted_num_samples
    return ne / (-pos_labels * torch.log2(mean_prediction)
                 - (weighted_num_samples - pos_labels) * torch.log2(1 - mean_prediction))


def get_cali_free_ne_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                            eta: float) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.cali_free_ne.get_cali_free_ne_states`: NE's sums and the weighted prediction sum."""
    return {**get_ne_states(labels, predictions, weights, eta),
            "weighted_sum_predictions": torch.sum(weights * predictions, dim=-1)}


class CaliFreeNEMetricComputation(EntropyComputation):
    """TorchRec's computation: NE's states and `weighted_sum_predictions` (float64, with windows), reports
    `cali_free_ne`."""

    _state_names = NE_STATES + ("weighted_sum_predictions",)
    _metric_name = MetricName.CALI_FREE_NE
    _get_states = staticmethod(get_cali_free_ne_states)
    _compute_value = staticmethod(compute_cali_free_ne)


class CaliFreeNEMetric(NEMetric):
    """Lifetime and window calibration-free NE per task (`cali_free_ne-{task}|{lifetime,window}_cali_free_ne`).

    Option: allow_missing_label_with_zero_weight (1e-12 instead of nan while a task has no weight; per task here,
    where TorchRec's fused modes report 1e-12 for the first task only, once any task has none).
    """

    _namespace = "cali_free_ne"
    _state_names = CaliFreeNEMetricComputation._state_names
    _options = {"allow_missing_label_with_zero_weight": False}
    _report_groups = ()

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_cali_free_ne_states(labels, predictions, weights, ETA)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"cali_free_ne": task_entropy(compute_cali_free_ne, states, self._options["allow_missing_label_with_zero_weight"])}


__all__ = ["CaliFreeNEMetric", "CaliFreeNEMetricComputation", "compute_cali_free_ne", "compute_cross_entropy", "get_cali_free_ne_states"]
