"""Weighted average of a model output other than the predictions
(`torchrec.metrics.tensor_weighted_avg.TensorWeightedAvgMetric`): each task names the tensor in its RecTaskInfo
(`tensor_name`, a required input RecMetricModule reads from the model output) and whether it is weighted
(`weighted`: sum(w * x) / sum(w), else the plain mean), lifetime and window, under TorchRec's `weighted_avg` keys.

As TorchRec's, an update counts `labels.shape[0]` samples in the window (the rows of its [tasks, batch] input: one
per update unfused, n_tasks fused), and the value is nan while a task has no weight.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = TensorWeightedAvgMetric(world_size=1, my_rank=0, batch_size=2,
    ...                                  tasks=[RecTaskInfo(name="t", tensor_name="bid")])
    >>> metric.update(predictions={"t": torch.zeros(2)}, labels={"t": torch.zeros(2)},
    ...               weights={"t": torch.tensor([3.0, 1.0])}, required_inputs={"bid": torch.tensor([2.0, 6.0])})
    >>> float(metric.compute()["weighted_avg-t|lifetime_weighted_avg"])   # (3 * 2 + 1 * 6) / 4
    3.0
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set, Union

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_config import RecTaskInfo
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException
from rectoolkit.metrics.sum_states import SumStatesComputation
from rectoolkit.metrics.weighted_avg import get_mean


class TensorWeightedAvgMetricComputation(SumStatesComputation):
    """TorchRec's states `weighted_sum` and `weighted_num_samples`; `tasks` (given by the metric) say which
    tensor each task averages and whether it is weighted."""

    _state_names = ("weighted_sum", "weighted_num_samples")

    def __init__(self, *args: Any, tasks: List[RecTaskInfo], description: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tasks = list(tasks)
        for task in self.tasks:
            if task.tensor_name is None:
                raise RecMetricException("TensorWeightedAvgMetricComputation expects all tasks to have tensor_name, "
                                         f"but got None (task {task.name!r}: set RecTaskInfo(tensor_name=...))")
        self._description = description
        self.weighted_mask = torch.tensor([task.weighted for task in self.tasks]).unsqueeze(dim=-1)

    def _num_samples(self, predictions: torch.Tensor, labels: torch.Tensor) -> int:
        return labels.shape[0]

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        required = kwargs.get("required_inputs")
        if required is None:
            raise RecMetricException("TensorWeightedAvgMetricComputation expects 'required_inputs' to exist.")
        name = "target_tensor" if len(self.tasks) > 1 else self.tasks[0].tensor_name
        if name not in required:
            raise RecMetricException(f"TensorWeightedAvgMetricComputation expects required_inputs to contain target "
                                     f"tensor {self.tasks[0].tensor_name if len(self.tasks) == 1 else name}")
        target = required[name]
        self.weighted_mask = self.weighted_mask.to(target.device)
        values = torch.where(self.weighted_mask, target * weights, target)
        counts = torch.where(self.weighted_mask, weights, torch.ones_like(weights))
        return {"weighted_sum": values.sum(dim=-1), "weighted_num_samples": counts.sum(dim=-1)}

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(MetricName.WEIGHTED_AVG, prefix, get_mean(total, samples), self._description)
                for (prefix, total), (_, samples) in zip(self._lifetime_and_window("weighted_sum"),
                                                         self._lifetime_and_window("weighted_num_samples"))]


class TensorWeightedAvgMetric(RecMetric):
    """`weighted_avg-{task}|{lifetime,window}_weighted_avg` of each task's `tensor_name` (TorchRec's constructor;
    `description` is appended to the keys). Tasks that share a tensor must agree on `weighted`."""

    _namespace = MetricNamespace.WEIGHTED_AVG
    _computation_class = TensorWeightedAvgMetricComputation

    def _get_task_kwargs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Dict[str, Any]:
        return {"tasks": [task_config] if isinstance(task_config, RecTaskInfo) else list(task_config)}

    def _get_task_required_inputs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Set[str]:
        weighted_by_tensor: Dict[str, bool] = {}
        for task in [task_config] if isinstance(task_config, RecTaskInfo) else task_config:
            if task.tensor_name is None:
                continue
            if weighted_by_tensor.get(task.tensor_name, task.weighted) is not task.weighted:
                raise RecMetricException(
                    f"This target tensor was already registered as weighted={weighted_by_tensor[task.tensor_name]}. "
                    f"This target tensor cannot be re-registered with weighted={task.weighted}")
            weighted_by_tensor[task.tensor_name] = task.weighted
        return set(weighted_by_tensor)


__all__ = ["TensorWeightedAvgMetric", "TensorWeightedAvgMetricComputation", "get_mean"]
