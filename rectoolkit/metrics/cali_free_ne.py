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

from rectoolkit.metrics.ne import ETA, NEMetric, normalized_entropy


class CaliFreeNEMetric(NEMetric):
    """Lifetime and window calibration-free NE per task (`cali_free_ne-{task}|{lifetime,window}_cali_free_ne`).

    Option: allow_missing_label_with_zero_weight (1e-12 instead of nan while a task has no weight; per task here,
    where TorchRec's fused modes report 1e-12 for the first task only, once any task has none).
    """

    _namespace = "cali_free_ne"
    _state_names = NEMetric._state_names + ("weighted_sum_predictions",)
    _options = {"allow_missing_label_with_zero_weight": False}
    _report_groups = ()

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        ne_states = super()._batch_states(predictions, labels, weights)
        return torch.cat([ne_states, (weights * predictions).sum().view(1)])

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        cross_entropy_sum, weighted_num_samples, positives, negatives, predicted = states
        if self._options["allow_missing_label_with_zero_weight"] and not weighted_num_samples > 0:
            return {"cali_free_ne": torch.tensor(ETA, dtype=torch.float64)}
        ne = normalized_entropy(cross_entropy_sum, weighted_num_samples, positives, negatives)
        mean_prediction = predicted / weighted_num_samples
        entropy_of_mean_prediction = (-positives * torch.log2(mean_prediction)
                                      - (weighted_num_samples - positives) * torch.log2(1 - mean_prediction))
        return {"cali_free_ne": ne / entropy_of_mean_prediction}


__all__ = ["CaliFreeNEMetric"]
