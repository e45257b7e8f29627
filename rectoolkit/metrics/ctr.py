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

from rectoolkit.metrics.rec_metric import SumStateMetric


class CTRMetric(SumStateMetric):
    """Lifetime and window CTR per task (`ctr-{task}|{lifetime,window}_ctr`)."""

    _namespace = "ctr"
    _state_names = ("ctr_num", "ctr_denom")

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.stack([(labels * weights).sum(), weights.sum()])

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        clicks, weight = states
        return {"ctr": clicks / weight if weight != 0 else torch.zeros((), dtype=torch.float64)}


__all__ = ["CTRMetric"]
