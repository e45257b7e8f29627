"""Logged model outputs (`torchrec.metrics.output.OutputMetric`): the mean of the latest update's `latest_imp` and
`total_latest_imp` model outputs (required inputs, which RecMetricModule reads from the model output), per task,
under `output-{task}|output_latest_imp` and `|output_total_latest_imp`; summed over the ranks and not saved, as
TorchRec's.

    >>> from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo
    >>> metric = OutputMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    >>> sorted(metric.get_required_inputs())
    ['latest_imp', 'total_latest_imp']
    >>> metric.update(predictions={"t": torch.zeros(2)}, labels={"t": torch.zeros(2)}, weights=None,
    ...               required_inputs={"latest_imp": torch.tensor([1.0, 2.0]), "total_latest_imp": torch.tensor([4.0, 6.0])})
    >>> {key: value.tolist() for key, value in metric.compute().items()}
    {'output-t|output_latest_imp': [1.5], 'output-t|output_total_latest_imp': [5.0]}
"""

from __future__ import annotations

from typing import Any, List, Optional, Set, Union

import torch

from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException

_OUTPUTS = ("latest_imp", "total_latest_imp")


class OutputMetricComputation(RecMetricComputation):
    """TorchRec's states `latest_imp` and `total_latest_imp` (the latest update's means; no window)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in _OUTPUTS:
            self._add_state(name, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=False,
                            dist_reduce_fx="sum", persistent=False)

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        required = kwargs.get("required_inputs")
        if required is None or not all(name in required for name in _OUTPUTS):
            raise RecMetricException("OutputMetricComputation requires 'latest_imp' and 'total_latest_imp' in kwargs "
                                     f"(required_inputs has {sorted(required or {})})")
        for name in _OUTPUTS:
            setattr(self, name, required[name].float().mean(dim=-1, dtype=torch.double))

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.OUTPUT, MetricPrefix.DEFAULT, getattr(self, name), f"_{name}")
                for name in _OUTPUTS]


class OutputMetric(RecMetric):
    """The latest `latest_imp` / `total_latest_imp` per task (TorchRec's constructor; the fused modes, which fail in
    TorchRec's compute(), are refused here)."""

    _namespace = MetricNamespace.OUTPUT
    _computation_class = OutputMetricComputation

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._compute_mode != RecComputeMode.UNFUSED_TASKS_COMPUTATION:
            raise RecMetricException(f"OutputMetric: compute_mode={self._compute_mode.name} is not supported (its "
                                     "states hold one value for all tasks, and TorchRec's compute() fails on them); "
                                     "use RecComputeMode.UNFUSED_TASKS_COMPUTATION")

    def _get_task_required_inputs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Set[str]:
        return set(_OUTPUTS)


__all__ = ["OutputMetric", "OutputMetricComputation"]
