"""Mean squared error (`torchrec.metrics.mse.MSEMetric`): weighted MSE and its root per task;
`include_r_squared=True` adds R^2 = 1 - error / total sum of squares (1 when the labels do not vary).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = MSEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> metric.update(predictions={"t": torch.tensor([1., 4.])}, labels={"t": torch.tensor([2., 2.])},
    ...               weights=None)
    >>> {key: float(value) for key, value in metric.compute().items() if "lifetime" in key}
    {'mse-t|lifetime_mse': 2.5, 'mse-t|lifetime_rmse': 1.5811388300841898}
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.rec_metric import SumStateMetric, ratio_or_zero
from rectoolkit.metrics.sum_states import SumStatesComputation


def compute_mse(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.mse.compute_mse`: per-task MSE (float64), 0 where there is no weight."""
    return ratio_or_zero(error_sum, weighted_num_samples)


def compute_rmse(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.mse.compute_rmse`: per-task RMSE (float64), 0 where there is no weight."""
    return torch.where(weighted_num_samples == 0.0, 0.0, torch.sqrt(error_sum / weighted_num_samples)).double()


def compute_r_squared(error_sum: torch.Tensor, weighted_num_samples: torch.Tensor, label_sum: torch.Tensor,
                      label_squared_sum: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.mse.compute_r_squared`: per-task R^2 (float64), 1 where the labels do not vary."""
    total_sum = label_squared_sum.double() - torch.square(label_sum.double()) / weighted_num_samples.double()
    return torch.where(total_sum == 0.0, 1.0, 1.0 - error_sum / total_sum).double()


def compute_error_sum(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.mse.compute_error_sum`: the weighted squared error summed over the last dim."""
    return torch.sum(weights * torch.square(labels - predictions.double()), dim=-1)


def get_mse_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.mse.get_mse_states`: a batch's sums over the last dim."""
    return {
        "error_sum": compute_error_sum(labels, predictions, weights),
        "weighted_num_samples": torch.sum(weights, dim=-1),
        "label_sum": torch.sum(weights * labels, dim=-1),
        "label_squared_sum": torch.sum(weights * torch.square(labels), dim=-1),
    }


MSE_STATES = ("error_sum", "weighted_num_samples", "label_sum", "label_squared_sum")


class MSEMetricComputation(SumStatesComputation):
    """TorchRec's MSE computation: states `error_sum`, `weighted_num_samples`, `label_sum`, `label_squared_sum`
    (float64, with windows; the label sums saved only with include_r_squared), reports `mse` and `rmse` (and
    `r_squared`)."""

    _state_names = MSE_STATES
    _weights_required = True

    def __init__(self, *args: Any, include_r_squared: bool = False, **kwargs: Any) -> None:
        self._include_r_squared = include_r_squared
        super().__init__(*args, **kwargs)

    def _is_persistent(self, name: str) -> bool:
        return name in MSE_STATES[:2] or name not in MSE_STATES or self._include_r_squared

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return get_mse_states(labels, predictions, weights)

    def _compute(self) -> List[MetricComputationReport]:
        # TorchRec's order: lifetime mse, rmse, window mse, rmse; then r_squared lifetime and window
        mse, rmse = (self._lifetime_and_window_reports(name, compute, MSE_STATES[:2])
                     for name, compute in ((MetricName.MSE, compute_mse), (MetricName.RMSE, compute_rmse)))
        reports = [mse[0], rmse[0], mse[1], rmse[1]]
        if self._include_r_squared:
            reports += self._lifetime_and_window_reports(MetricName.R_SQUARED, compute_r_squared, MSE_STATES)
        return reports


class MSEMetric(SumStateMetric):
    """Lifetime and window MSE and RMSE per task (`mse-{task}|{lifetime,window}_{mse,rmse}`; `r_squared` too
    with include_r_squared)."""

    _namespace = "mse"
    _state_names = MSE_STATES
    _options = {"include_r_squared": False}
    _report_groups = (("mse", "rmse"), ("r_squared",))

    def _persistent_states(self) -> Tuple[str, ...]:
        """TorchRec saves the label sums only when they are used (include_r_squared)."""
        return self._state_names if self._options["include_r_squared"] else self._state_names[:2]

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor,
                      weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_mse_states(labels, predictions, weights)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        error_sum, weighted_num_samples = states[:2]
        values = {"mse": compute_mse(error_sum, weighted_num_samples),
                  "rmse": compute_rmse(error_sum, weighted_num_samples)}
        if self._options["include_r_squared"]:
            values["r_squared"] = compute_r_squared(*states)
        return values


__all__ = ["MSE_STATES", "MSEMetric", "MSEMetricComputation", "compute_error_sum", "compute_mse", "compute_r_squared", "compute_rmse", "get_mse_states"]
