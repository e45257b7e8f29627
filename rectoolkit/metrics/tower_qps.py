"""Tower QPS (`torchrec.metrics.tower_qps.TowerQPSMetric`): examples per second of a tower whose batches vary in
size, per task: the examples of all ranks (summed) over the slowest rank's time (the ranks' time lapses reduced
by max), measured from the updates' wall-clock times (`time.monotonic`), as TorchRec's.

An update counts the labels of each task. The first `warmup_steps` updates are counted but not timed; after them
each update adds the time since the previous one. compute() returns `qps-{task}|lifetime_qps` (examples after the
warm-up over their time; 0 while no time has passed), `|window_qps` (the last window_size examples) and
`|total_examples`.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = TowerQPSMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")], warmup_steps=1)
    >>> metric.update(predictions=None, labels={"t": torch.zeros(4)}, weights=None)
    >>> {key: float(value) for key, value in metric.compute().items()}   # warming up: no rate yet
    {'qps-t|lifetime_qps': 0.0, 'qps-t|window_qps': 0.0, 'qps-t|total_examples': 4.0}
"""

from __future__ import annotations

import time
from typing import Any, List, Optional

import torch

from rectoolkit.metrics.computation import _FUSED, MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException, RecModelOutput

WARMUP_STEPS = 100
NUM_EXAMPLES, WARMUP_EXAMPLES, TIME_LAPSE = "num_examples", "warmup_examples", "time_lapse"


def _max_reduction(state: torch.Tensor) -> torch.Tensor:
    """The ranks' stacked time lapses reduced to the slowest rank's."""
    return torch.max(state, dim=0).values


def _qps(num_examples: torch.Tensor, time_lapse: torch.Tensor) -> torch.Tensor:
    return torch.where(time_lapse <= 0.0, 0.0, num_examples / time_lapse).double()


class TowerQPSMetricComputation(RecMetricComputation):
    """TorchRec's states: `num_examples` and `warmup_examples` (int64, summed over ranks), `time_lapse` (float64
    seconds, the max over ranks); `num_examples` and `time_lapse` have window states."""

    def __init__(self, *args: Any, warmup_steps: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warmup_steps = warmup_steps
        self._add_state(NUM_EXAMPLES, torch.zeros(self._n_tasks, dtype=torch.long), add_window_state=True,
                        dist_reduce_fx="sum", persistent=True)
        self._add_state(WARMUP_EXAMPLES, torch.zeros(self._n_tasks, dtype=torch.long), add_window_state=False,
                        dist_reduce_fx="sum", persistent=True)
        self._add_state(TIME_LAPSE, torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                        dist_reduce_fx=_max_reduction, persistent=True)
        self._previous_ts = 0.0
        self._steps = 0

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        self._steps += 1
        batch_examples = labels.shape[-1]
        examples = torch.tensor(batch_examples, dtype=torch.long)
        self.num_examples += examples
        now = time.monotonic()
        if self._steps <= self._warmup_steps:
            self.warmup_examples += examples
            if self._steps == self._warmup_steps:
                self._previous_ts = now
            return
        self._aggregate_window_state(NUM_EXAMPLES, examples, batch_examples)
        time_lapse = torch.tensor(now - self._previous_ts, dtype=torch.double)
        self.time_lapse += time_lapse
        self._aggregate_window_state(TIME_LAPSE, time_lapse, batch_examples)
        self._previous_ts = now

    def _compute(self) -> List[MetricComputationReport]:
        return [
            MetricComputationReport(MetricName.TOWER_QPS, MetricPrefix.LIFETIME,
                                    _qps(self.num_examples - self.warmup_examples, self.time_lapse)),
            MetricComputationReport(MetricName.TOWER_QPS, MetricPrefix.WINDOW,
                                    _qps(self.get_window_state(NUM_EXAMPLES), self.get_window_state(TIME_LAPSE))),
            MetricComputationReport(MetricName.TOTAL_EXAMPLES, MetricPrefix.DEFAULT, self.num_examples.detach()),
        ]


class TowerQPSMetric(RecMetric):
    """Tower QPS per task (TorchRec's constructor, with `warmup_steps`, default 100). update() reads only the
    labels (their count per task); in the fused modes they are viewed as [n_tasks, batch_size] as TorchRec's.
    `fused_update_limit` > 0 is refused (as TorchRec's), and so is `batch_size_stages` (not implemented)."""

    _namespace = MetricNamespace.TOWER_QPS
    _computation_class = TowerQPSMetricComputation

    def __init__(self, world_size: int, my_rank: int, batch_size: int, tasks: List[RecTaskInfo],
                 compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION, window_size: int = 100,
                 fused_update_limit: int = 0, process_group: Optional[Any] = None, warmup_steps: int = WARMUP_STEPS,
                 batch_size_stages: Optional[List[Any]] = None, **kwargs: Any) -> None:
        if fused_update_limit > 0:
            raise RecMetricException("Fused update is not supported for tower QPS")
        if batch_size_stages is not None:
            raise NotImplementedError(f"TowerQPSMetric: batch_size_stages={batch_size_stages!r} is not implemented "
                                      "in rectoolkit; pass None (one batch size)")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"TowerQPSMetric: warmup_steps={warmup_steps!r} must be an int >= 0")
        super().__init__(world_size=world_size, my_rank=my_rank, batch_size=batch_size, tasks=tasks,
                         compute_mode=compute_mode, window_size=window_size, fused_update_limit=fused_update_limit,
                         process_group=process_group, warmup_steps=warmup_steps, **kwargs)

    def update(self, *, predictions: Optional[RecModelOutput], labels: RecModelOutput,
               weights: Optional[RecModelOutput], **kwargs: Any) -> None:
        """Count each task's labels (predictions and weights are not read) and time the step."""
        if any(computation._is_synced for computation in self._metrics_computations):
            raise RecMetricException("TowerQPSMetric.update: the metric is synced; call unsync() first")
        with torch.no_grad():
            if self._compute_mode in _FUSED:
                if not isinstance(labels, torch.Tensor):
                    missing = [task.name for task in self._tasks if task.name not in labels]
                    if missing:
                        raise RecMetricException(f"TowerQPSMetric: the fused modes need every task's labels; "
                                                 f"missing {missing}")
                    labels = torch.stack([labels[task.name] for task in self._tasks])
                self._metrics_computations[0].update(predictions=None, labels=labels.view(-1, self._batch_size),
                                                     weights=None)
                return
            if isinstance(labels, torch.Tensor):
                raise TypeError("TowerQPSMetric: in UNFUSED_TASKS_COMPUTATION mode labels is a dict {task name: "
                                "tensor} (as TorchRec's)")
            for task, computation in zip(self._tasks, self._metrics_computations):
                if task.name in labels:
                    computation.update(predictions=None, labels=labels[task.name].view(1, -1), weights=None)


__all__ = ["TowerQPSMetric", "TowerQPSMetricComputation", "WARMUP_STEPS"]
