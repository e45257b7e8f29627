"""Normalized MSE (`torchrec.metrics.nmse.NMSEMetric`): the weighted MSE (see mse.py) divided by the MSE of always
predicting 1, and the RMSE by that baseline's RMSE (0 where the baseline is 0, as TorchRec's):

    nmse = sum w (y - p)^2 / sum w (y - 1)^2,   nrmse = sqrt(nmse)

States: MSE's and `const_pred_error_sum` (the baseline's squared error). include_r_squared only adds the label
sums to the state_dict, as TorchRec's (NMSE reports no R^2).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = NMSEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([1., 2.])}, labels={"t": torch.tensor([2., 3.])},
    ...               weights=None)
    >>> {key: float(value) for key, value in metric.compute().items() if "lifetime" in key}   # 2 / 5
    {'nmse-t|lifetime_nmse': 0.4, 'nmse-t|lifetime_nrmse': 0.6324555320336759}
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.mse import (MSE_STATES, MSEMetric, MSEMetricComputation, compute_error_sum, compute_mse,
                                    compute_rmse, get_mse_states)
from rectoolkit.metrics.rec_metric import ratio_or_zero


def compute_norm(model_error_sum: torch.Tensor, baseline_error_sum: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.nmse.compute_norm`: the model's error over the baseline's (float64), 0 where the latter
    is 0."""
    return ratio_or_zero(model_error_sum, baseline_error_sum)


def get_norm_mse_states(labels: torch.Tensor, predictions: torch.Tensor,
                        weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.nmse.get_norm_mse_states`: MSE's sums and the error of predicting 1."""
    return {**get_mse_states(labels, predictions, weights),
            "const_pred_error_sum": compute_error_sum(labels, torch.ones_like(labels), weights)}


def compute_nmse_and_nrmse(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor,
                           const_pred_error_sum: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(nmse, nrmse): the model's MSE and RMSE over those of predicting 1, as TorchRec's computation reports them."""
    return tuple(compute_norm(compute(error_sum, weighted_num_samples), compute(const_pred_error_sum,
                                                                                weighted_num_samples))
                 for compute in (compute_mse, compute_rmse))


class NMSEMetricComputation(MSEMetricComputation):
    """TorchRec's computation: MSE's states and `const_pred_error_sum` (the error of predicting 1), reports `nmse`
    and `nrmse` (the model's MSE / RMSE over the constant's), lifetime then window."""

    _state_names = MSE_STATES + ("const_pred_error_sum",)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return get_norm_mse_states(labels, predictions, weights)

    def _compute(self) -> List[MetricComputationReport]:
        reports = []
        for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW):
            values = compute_nmse_and_nrmse(*self._states_at(prefix, ("error_sum", "weighted_num_samples",
                                                                      "const_pred_error_sum")))
            reports += [MetricComputationReport(name, prefix, value)
                        for name, value in zip((MetricName.NMSE, MetricName.NRMSE), values)]
        return reports


class NMSEMetric(MSEMetric):
    """Lifetime and window NMSE and NRMSE per task (`nmse-{task}|{lifetime,window}_{nmse,nrmse}`)."""

    _namespace = "nmse"
    _state_names = NMSEMetricComputation._state_names
    _report_groups = (("nmse", "nrmse"),)

    def _persistent_states(self) -> Tuple[str, ...]:
        return super()._persistent_states() + ("const_pred_error_sum",)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_norm_mse_states(labels, predictions, weights)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        nmse, nrmse = compute_nmse_and_nrmse(states[0], states[1], states[4])
        return {"nmse": nmse, "nrmse": nrmse}


__all__ = ["NMSEMetric", "NMSEMetricComputation", "compute_nmse_and_nrmse", "compute_norm", "get_norm_mse_states"]
