"""Mean absolute error (`torchrec.metrics.mae.MAEMetric`): the weighted mean of |label - prediction| per task
(0 while there is no weight).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = MAEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([1., 4.])}, labels={"t": torch.tensor([2., 2.])},
    ...               weights={"t": torch.tensor([1., 3.])})
    >>> float(metric.compute()["mae-t|lifetime_mae"])   # (1 * 1 + 3 * 2) / 4
    1.75
"""

from __future__ import annotations

from typing import Dict

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import SumStateMetric, ratio_or_zero
from rectoolkit.metrics.sum_states import OneValueComputation


def compute_mae(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.mae.compute_mae`: per-task MAE (float64), 0 where there is no weight."""
    return ratio_or_zero(error_sum, weighted_num_samples)


def compute_error_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.mae.compute_error_sum`: the weighted absolute error summed over the last dim."""
    return torch.sum(weights * torch.abs(labels - predictions.double()), dim=-1)


def get_mae_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.mae.get_mae_states`: a batch's sums over the last dim."""
    return {"error_sum": compute_error_sum(labels, predictions, weights),
            "weighted_num_samples": torch.sum(weights, dim=-1)}


class MAEMetricComputation(OneValueComputation):
    """TorchRec's MAE computation: states `error_sum`, `weighted_num_samples` (float64, with windows), reports
    `mae`."""

    _state_names = ("error_sum", "weighted_num_samples")
    _weights_required = True
    _metric_name = MetricName.MAE
    _get_states = staticmethod(get_mae_states)
    _compute_value = staticmethod(compute_mae)


class MAEMetric(SumStateMetric):
    """Lifetime and window MAE per task (`mae-{task}|{lifetime,window}_mae`)."""

    _namespace = "mae"
    _state_names = MAEMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_mae_states(labels, predictions, weights)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"mae": compute_mae(*states)}


__all__ = ["MAEMetric", "MAEMetricComputation", "compute_error_sum", "compute_mae", "get_mae_states"]
