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


class XAUCMetricComputation(SumStatesComputation):
    """TorchRec's states: `error_sum` (the weight of the pairs ordered alike) and `weighted_num_pairs`."""

    _state_names = (ERROR_SUM, WEIGHTED_NUM_PAIRS)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        # [n_tasks, batch, batch] over the pairs (i, j), i < j
        pair_weights = (weights.unsqueeze(-1) * weights.unsqueeze(-2)).double()
        pair_weights = torch.triu(pair_weights, diagonal=1)
        predictions = predictions.double()
        prediction_order = torch.sign(predictions.unsqueeze(-1) - predictions.unsqueeze(-2))
        label_order = torch.sign(labels.unsqueeze(-1) - labels.unsqueeze(-2))
        agree = (prediction_order == label_order).double()
        return {ERROR_SUM: (pair_weights * agree).sum(dim=(-2, -1)),
                WEIGHTED_NUM_PAIRS: pair_weights.sum(dim=(-2, -1))}

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.XAUC, prefix, safe_ratio(error_sum, pairs))
                for (prefix, error_sum), (_, pairs) in zip(self._lifetime_and_window(ERROR_SUM),
                                                           self._lifetime_and_window(WEIGHTED_NUM_PAIRS))]


class XAUCMetric(RecMetric):
    """`xauc-{task}|{lifetime,window}_xauc` per task (TorchRec's constructor)."""

    _namespace = MetricNamespace.XAUC
    _computation_class = XAUCMetricComputation


__all__ = ["XAUCMetric", "XAUCMetricComputation"]
