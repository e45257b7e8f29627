"""XAUC (`torchrec.metrics.xauc.XAUCMetric`): of the weighted pairs of samples inside a batch (weight w_i * w_j per
pair i < j), the share ordered alike by prediction and by label (both ascending, both descending, or both tied),
lifetime and window, 0 while there is no pair. Pairs are formed within each batch only, as TorchRec's.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = XAUCMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([0.1, 0.5, 0.9])}, labels={"t": torch.tensor([1.0, 2.0, 0.0])},
    ...               weights=None)
    >>> round(float(metric.compute()["xauc-t|lifetime_xauc"]), 4)   # (0,1) agrees; (0,2) and (1,2) do not
    0.3333
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric
from rectoolkit.metrics.sum_states import SumStatesComputation, safe_ratio

ERROR_SUM = "error_sum"
WEIGHTED_NUM_PAIRS = "weighted_num_pairs"


def _pair_weights(weights: torch.Tensor) -> torch.Tensor:
    """[n_tasks, batch, batch]: w_i w_j over the pairs (i, j), i < j (0 elsewhere)."""
    return torch.triu(weights.unsqueeze(-1) * weights.unsqueeze(-2), diagonal=1)


def compute_xauc(error_sum: torch.Tensor, weighted_num_pairs: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.xauc.compute_xauc`: per-task XAUC (float64), 0 where there is no pair."""
    return safe_ratio(error_sum, weighted_num_pairs)


def compute_error_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.xauc.compute_error_sum`: per task, the weight of the pairs whose predictions are ordered
    as their labels (ties with ties), float64."""
    predictions = predictions.double()
    prediction_order = torch.sign(predictions.unsqueeze(-1) - predictions.unsqueeze(-2))
    label_order = torch.sign(labels.unsqueeze(-1) - labels.unsqueeze(-2))
    return (_pair_weights(weights) * (prediction_order == label_order).double()).sum(dim=(-2, -1))


def compute_weighted_num_pairs(weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.xauc.compute_weighted_num_pairs`: per task, the weight of all pairs (weights' dtype)."""
    return _pair_weights(weights).sum(dim=(-2, -1))


def get_xauc_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.xauc.get_xauc_states`: a batch's sums."""
    return {ERROR_SUM: compute_error_sum(labels, predictions, weights),
            WEIGHTED_NUM_PAIRS: compute_weighted_num_pairs(weights)}


class XAUCMetricComputation(SumStatesComputation):
    """TorchRec's states: `error_sum` (the weight of the pairs ordered alike) and `weighted_num_pairs`."""

    _state_names = (ERROR_SUM, WEIGHTED_NUM_PAIRS)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        states = get_xauc_states(labels, predictions, weights)
        return {name: value.double() for name, value in states.items()}

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.XAUC, prefix, safe_ratio(error_sum, pairs))
                for (prefix, error_sum), (_, pairs) in zip(self._lifetime_and_window(ERROR_SUM),
                                                           self._lifetime_and_window(WEIGHTED_NUM_PAIRS))]


class XAUCMetric(RecMetric):
    """`xauc-{task}|{lifetime,window}_xauc` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.XAUC
    _computation_class = XAUCMetricComputation


__all__ = ["XAUCMetric", "XAUCMetricComputation", "compute_error_sum", "compute_weighted_num_pairs", "compute_xauc",
           "get_xauc_states"]
