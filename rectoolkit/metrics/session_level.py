"""What the session-level precision and recall share (`torchrec.metrics.precision_session`,
`torchrec.metrics.recall_session`): within each session (a per-sample id, a required input named by the task's
`SessionMetricDef.session_var_name`), the `top_threshold` highest predictions count as predicted positive; with
`run_ranking_of_labels` the labels are ranked the same way. Unfused mode only, one SessionMetricDef per task, as
TorchRec's. A value is nan (with a warning) while its denominator is 0.

    >>> ranking_within_session(torch.tensor([[0.9, 0.2, 0.5, 0.7]]), torch.tensor([[1, 1, 1, 2]])).tolist()
    [0, 2, 1, 0]
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Set, Tuple, Union

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo, SessionMetricDef
from rectoolkit.metrics.metrics_namespace import MetricNameBase
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException
from rectoolkit.metrics.sum_states import SumStatesComputation

logger = logging.getLogger(__name__)


def ranking_within_session(predictions: torch.Tensor, session: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.recall_session.ranking_within_session`: each sample's rank in its session, for a task's
    [1, batch] row the number of samples of its session with a strictly higher value. As TorchRec's, the pairs are
    laid out by `predictions.size(0)`: a 1-D [batch] input counts the strictly lower values instead."""
    rows = predictions.size(0)
    same_session = session.view(-1, rows) == session.view(rows, -1)
    not_below = predictions.view(-1, rows) >= predictions.view(rows, -1)
    return torch.sum(same_session & ~not_below, dim=-1)


def nan_unless_positive(numerator: torch.Tensor, denominator: torch.Tensor, what: str) -> torch.Tensor:
    """numerator / denominator, or tensor([nan]) with a warning while the denominator is 0 (as TorchRec's)."""
    if denominator.item() != 0:
        return numerator / denominator
    logger.warning(f"{what} = NaN: no {'positive examples' if what == 'Recall' else 'predicted positives'} passed to "
                   "the metric yet")
    return torch.tensor([float("nan")])


class SessionComputation(SumStatesComputation):
    """Two weighted counts over the session-ranked decisions; a subclass names them, says how a batch adds to them
    (`_counts`) and reports their ratio under `_metric_name`."""

    _metric_name: Optional[MetricNameBase] = None
    _what = ""

    def __init__(self, *args: Any, session_metric_def: SessionMetricDef, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.top_threshold = session_metric_def.top_threshold
        self.run_ranking_of_labels = session_metric_def.run_ranking_of_labels
        self.session_var_name = session_metric_def.session_var_name

    def _counts(self, labels: torch.Tensor, predicted: torch.Tensor, weights: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The batch's two counts (TP first) from 0/1 labels and decisions."""
        raise NotImplementedError

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        required = kwargs.get("required_inputs")
        if required is None or self.session_var_name not in required:
            raise RecMetricException(f"Need the {self.session_var_name} input to update the session metric")
        session = required[self.session_var_name]
        if not (labels.dim() == 2 and labels.shape == predictions.shape == weights.shape == session.shape):
            raise RecMetricException(f"{type(self).__name__}: labels {tuple(labels.shape)}, predictions "
                                     f"{tuple(predictions.shape)}, weights {tuple(weights.shape)} and session "
                                     f"{tuple(session.shape)} must be the same [1, batch] shape")
        predictions, labels, weights = predictions.double(), labels.double(), weights.double()
        predicted = (ranking_within_session(predictions, session) < self.top_threshold).to(torch.int32)
        if self.run_ranking_of_labels:
            labels = (ranking_within_session(labels, session) < self.top_threshold).to(torch.int32)
        return dict(zip(self._state_names, self._counts(labels, predicted, weights)))

    def _compute(self) -> List[MetricComputationReport]:
        true_pos, other = self._state_names
        return [MetricComputationReport(self._metric_name, prefix, nan_unless_positive(tp, tp + count, self._what))
                for (prefix, tp), (_, count) in zip(self._lifetime_and_window(true_pos), self._lifetime_and_window(other))]


class SessionMetric(RecMetric):
    """A session-level metric: refuses the fused modes and fused updates, and tasks without a SessionMetricDef or
    its top_threshold (as TorchRec's); reads each task's session ids as a required input."""

    _what = ""

    def __init__(self, world_size: int, my_rank: int, batch_size: int, tasks: List[RecTaskInfo],
                 compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION, window_size: int = 100,
                 fused_update_limit: int = 0, process_group: Optional[Any] = None, **kwargs: Any) -> None:
        if compute_mode != RecComputeMode.UNFUSED_TASKS_COMPUTATION:
            raise RecMetricException(f"Fused computation is not supported for {self._what} session-level metrics")
        if fused_update_limit > 0:
            raise RecMetricException(f"Fused update is not supported for {self._what} session-level metrics")
        for task in tasks:
            if task.session_metric_def is None:
                raise RecMetricException(f"Please, specify the session metric definition (task {task.name!r}: "
                                         "RecTaskInfo(session_metric_def=SessionMetricDef(...)))")
            if task.session_metric_def.top_threshold is None:
                raise RecMetricException(f"Please, specify the top threshold (task {task.name!r}: "
                                         "SessionMetricDef(top_threshold=...))")
        super().__init__(world_size=world_size, my_rank=my_rank, batch_size=batch_size, tasks=tasks,
                         compute_mode=compute_mode, window_size=window_size, fused_update_limit=fused_update_limit,
                         process_group=process_group, **kwargs)

    def _get_task_kwargs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Dict[str, Any]:
        if isinstance(task_config, list):
            raise RecMetricException("Session metric can only take one task at a time")
        return {"session_metric_def": task_config.session_metric_def}

    def _get_task_required_inputs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Set[str]:
        if isinstance(task_config, list):
            raise RecMetricException("Session metric can only take one task at a time")
        name = task_config.session_metric_def.session_var_name
        return {name} if name else set()


__all__ = ["SessionComputation", "SessionMetric", "nan_unless_positive", "ranking_within_session"]
