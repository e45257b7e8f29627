"""Click-through rate (`torchrec.metrics.ctr.CTRMetric`): the weighted mean label (0 while there is no weight).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = CTRMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.zeros(4)}, labels={"t": torch.tensor([1., 0., 0., 0.])},
    ...               weights=None)
    >>> float(metric.compute()["ctr-t|lifetime_ctr"])
    0.25
"""

from __future__ import annotations

from typing import Dict

import torch

from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import SumStateMetric, ratio_or_zero
from rectoolkit.metrics.sum_states import OneValueComputation


def compute_ctr(ctr_num: torch.Tensor, ctr_denom: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.ctr.compute_ctr`: per-task CTR (float64), 0 where there is no weight."""
    return ratio_or_zero(ctr_num, ctr_denom)


def get_ctr_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.ctr.get_ctr_states`: a batch's sums over the last dim."""
    return {"ctr_num": torch.sum(labels * weights, dim=-1), "ctr_denom": torch.sum(weights, dim=-1)}


class CTRMetricComputation(OneValueComputation):
    """TorchRec's CTR computation: states `ctr_num`, `ctr_denom` (float64, with windows), reports `ctr`."""

    _state_names = ("ctr_num", "ctr_denom")
    _weights_required = True
    _metric_name = MetricName.CTR
    _get_states = staticmethod(get_ctr_states)
    _compute_value = staticmethod(compute_ctr)


class CTRMetric(SumStateMetric):
    """Lifetime and window CTR per task (`ctr-{task}|{lifetime,window}_ctr`)."""

    _namespace = "ctr"
    _state_names = CTRMetricComputation._state_names

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_ctr_states(labels, predictions, weights)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"ctr": compute_ctr(*states)}


__all__ = ["CTRMetric", "CTRMetricComputation", "compute_ctr", "get_ctr_states"]
