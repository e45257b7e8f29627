"""NDCG, normalized discounted cumulative gain (`torchrec.metrics.ndcg.NDCGMetric`): how well the predictions
rank each session's samples by label, reported as a loss, 1 - NDCG, as TorchRec does.

The sessions are named by a session id per sample, a required input: `get_required_inputs()` is
`{session_key}` (default `"session_id"`), RecMetricModule.update reads it from the model output, and a metric
fed directly takes it as `update(..., required_inputs={"session_id": ids})`. Within a session of a batch,

    DCG = sum over ranks r of gain_r / log2(r + 1),   gain = label (or 2^label - 1 with exponential_gain=True),

ranked by prediction from the highest down (ties in batch order, as TorchRec's sort), and the ideal DCG ranks by
label (0 becomes 1e-6). The session's value, 1 - DCG / ideal DCG (NDCG itself with
report_ndcg_as_decreasing_curve=False), is multiplied by the session's largest weight (at least 0), and

    ndcg = sum of the sessions' values / number of sessions,

over the sessions of every batch (a session in two batches counts twice; nan before any session, as TorchRec).
Keys `ndcg-{task}|lifetime_ndcg`, `ndcg-{task}|window_ndcg`; the window is NE's (whole batches).

Options (RecMetricDef.arguments, TorchRec's): `k` (only ranks up to k count; -1: all), `exponential_gain`,
`report_ndcg_as_decreasing_curve`, `remove_single_length_sessions` (a batch's one-sample sessions are dropped;
a batch left with none adds nothing, not even to the window), `scale_by_weights_tensor` (labels and predictions
are multiplied by the weights first, and the session value is not), `session_key`. A task with
`RecTaskInfo(is_negative_task=True)` is ranked on 1 - prediction by 1 - label.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> ndcg = NDCGMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")], window_size=3)
    >>> ndcg.get_required_inputs()
    {'session_id'}
    >>> ndcg.update(predictions={"t": torch.tensor([0.9, 0.5, 0.1])}, labels={"t": torch.tensor([0., 1., 0.])},
    ...             weights=None, required_inputs={"session_id": torch.tensor([4, 4, 4])})
    >>> round(float(ndcg.compute()["ndcg-t|lifetime_ndcg"]), 4)   # the relevant sample ranked 2nd: 1 - 1/log2(3)
    0.3691
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Set

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName
from rectoolkit.metrics.model_utils import ModelOutputError, session_ids_to_tensor
from rectoolkit.metrics.rec_metric import MissingRequiredInputError, RecMetricException, SumStateMetric
from rectoolkit.metrics.sum_states import SumStatesComputation

SESSION_KEY = "session_id"


def _discounted_gains(gains: torch.Tensor, ranked_by: torch.Tensor, session_of: torch.Tensor,
                      lengths: torch.Tensor, cutoff: int) -> torch.Tensor:
    """Per session, the DCG of `gains` ranked by `ranked_by` from the highest down (ties in batch order)."""
    order = torch.argsort(ranked_by, descending=True, stable=True)
    order = order[torch.argsort(session_of[order], stable=True)]  # grouped by session, each still ranked
    starts = torch.cumsum(lengths, 0) - lengths
    rank = torch.arange(1, order.numel() + 1) - starts[session_of[order]]
    discount = torch.where(rank <= cutoff, 1 / torch.log2(rank.double() + 1), 0.0)
    return torch.zeros(lengths.numel(), dtype=torch.float64).index_add_(0, session_of[order], gains[order] * discount)


def session_ndcg_sums(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      session_ids: torch.Tensor, *, exponential_gain: bool = False, k: int = -1,
                      report_ndcg_as_decreasing_curve: bool = True, remove_single_length_sessions: bool = False,
                      scale_by_weights_tensor: bool = False) -> Optional[torch.Tensor]:
    """[sum of the sessions' values, number of sessions] (float64) of one task's batch (see the module
    docstring); None when the batch has no session left."""
    predictions, labels, weights = predictions.double(), labels.double(), weights.double()
    _, session_of, lengths = torch.unique(session_ids, return_inverse=True, return_counts=True)
    if remove_single_length_sessions:
        kept = lengths[session_of] > 1
        predictions, labels, weights = predictions[kept], labels[kept], weights[kept]
        _, session_of, lengths = torch.unique(session_ids[kept], return_inverse=True, return_counts=True)
    if not lengths.numel():
        return None
    if scale_by_weights_tensor:
        labels, predictions = weights * labels, weights * predictions
    gains = torch.exp2(labels) - 1 if exponential_gain else labels
    cutoff = int(lengths.max()) if k == -1 else min(k, int(lengths.max()))
    ideal = _discounted_gains(gains, labels, session_of, lengths, cutoff)
    ideal[ideal == 0] = 1e-6
    ndcg = _discounted_gains(gains, predictions, session_of, lengths, cutoff) / ideal
    values = 1 - ndcg if report_ndcg_as_decreasing_curve else ndcg
    if not scale_by_weights_tensor:
        largest_weight = torch.zeros(lengths.numel(), dtype=torch.float64).scatter_reduce_(0, session_of, weights,
                                                                                           reduce="amax")
        values = values * largest_weight
    return torch.stack([values.sum(), torch.tensor(float(lengths.numel()), dtype=torch.float64)])


def _check_k(owner: str, k: Any) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or (k != -1 and k < 1):
        raise ValueError(f"{owner}: k={k!r} must be a positive int (rank cutoff) or -1 (every rank)")


class NDCGComputation(SumStatesComputation):
    """TorchRec's NDCG computation: states `sum_ndcg`, `num_sessions` (float64, with windows), reports `ndcg`
    (sum_ndcg / num_sessions), TorchRec's options; update() reads the session ids of
    `required_inputs[session_key]` ([n_tasks, batch], equal rows); the tasks of is_negative_task_mask are flipped
    on copies (TorchRec flips the caller's tensors in place). A batch with no session left adds nothing."""

    _state_names = ("sum_ndcg", "num_sessions")

    def __init__(self, *args: Any, exponential_gain: bool = False, session_key: str = SESSION_KEY, k: int = -1,
                 report_ndcg_as_decreasing_curve: bool = True, remove_single_length_sessions: bool = False,
                 scale_by_weights_tensor: bool = False, is_negative_task_mask: Optional[List[bool]] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _check_k(type(self).__name__, k)
        self._session_key = session_key
        self._is_negative_task_mask = is_negative_task_mask
        self._options = {"exponential_gain": exponential_gain, "k": k,
                         "report_ndcg_as_decreasing_curve": report_ndcg_as_decreasing_curve,
                         "remove_single_length_sessions": remove_single_length_sessions,
                         "scale_by_weights_tensor": scale_by_weights_tensor}

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        name = type(self).__name__
        required = kwargs.get("required_inputs") or {}
        if required.get(self._session_key) is None:
            raise MissingRequiredInputError(f"{name}.update: required_inputs has no {self._session_key!r} (it has "
                                            f"{sorted(required)}); pass the session ids, one per sample")
        if predictions is None or weights is None:
            raise RecMetricException(f"{name}.update: predictions and weights must be tensors of the labels' shape, "
                                     "got None")
        session_ids = required[self._session_key]
        if not (predictions.shape == labels.shape == weights.shape == session_ids.shape and predictions.dim() == 2
                and predictions.numel() > 0) or (session_ids != session_ids[:1]).any():
            raise ModelOutputError(f"{name}.update: predictions {tuple(predictions.shape)}, labels "
                                   f"{tuple(labels.shape)}, weights {tuple(weights.shape)} and session ids "
                                   f"{tuple(session_ids.shape)} must all be [n_tasks, batch], the session ids equal "
                                   "in every row")
        if self._is_negative_task_mask is not None:
            predictions, labels = predictions.clone(), labels.clone()
            predictions[self._is_negative_task_mask, :] = 1 - predictions[self._is_negative_task_mask, :]
            labels[self._is_negative_task_mask, :] = 1 - labels[self._is_negative_task_mask, :]
        super().update(predictions=predictions, labels=labels, weights=weights, session_ids=session_ids[0])

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        sums = [session_ndcg_sums(p, y, w, kwargs["session_ids"], **self._options)
                for p, y, w in zip(predictions, labels, weights)]
        if any(task_sums is None for task_sums in sums):  # every session a single sample, removed
            return {}
        stacked = torch.stack(sums)
        return {"sum_ndcg": stacked[:, 0], "num_sessions": stacked[:, 1]}

    def _compute(self) -> List[MetricComputationReport]:
        return self._lifetime_and_window_reports(MetricName.NDCG, torch.div, self._state_names)


class NDCGMetric(SumStateMetric):
    """Lifetime and window 1 - NDCG per task over the sessions named by the `session_key` required input
    (TorchRec's constructor and options, see the module docstring)."""

    _namespace = "ndcg"
    _state_names = NDCGComputation._state_names
    _options = {"exponential_gain": False, "session_key": SESSION_KEY, "k": -1,
                "report_ndcg_as_decreasing_curve": True, "remove_single_length_sessions": False,
                "scale_by_weights_tensor": False}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _check_k("NDCGMetric", self._options["k"])
        if not isinstance(self._options["session_key"], str):
            raise TypeError(f"NDCGMetric: session_key={self._options['session_key']!r} must be the name of the "
                            "model output holding the session ids (a str)")

    def get_required_inputs(self) -> Set[str]:
        return {self._options["session_key"]}

    def _batch_inputs(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        key = self._options["session_key"]
        required = kwargs.get("required_inputs") or {}
        if required.get(key) is None:
            raise MissingRequiredInputError(
                f"NDCGMetric.update: required_inputs has no {key!r} (it has {sorted(required)}); pass "
                f"update(..., required_inputs={{{key!r}: <one session id per sample>}}), or, through a "
                f"RecMetricModule, a model output {key!r}")
        return {"session_ids": torch.as_tensor(required[key]).detach().cpu()}

    def _update_task(self, task_index: int, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     session_ids: torch.Tensor) -> None:
        task = self._tasks[task_index]
        count = predictions.numel()
        # [batch], or TorchRec's fused layout [n_tasks, batch] with the same ids in every row
        fits = session_ids.numel() == count or (session_ids.dim() == 2 and session_ids.shape[1] == count)
        rows = session_ids.reshape(-1, count) if fits else None
        if rows is None or (rows != rows[:1]).any():
            raise ValueError(f"NDCGMetric.update: required_inputs[{self._options['session_key']!r}] has shape "
                             f"{tuple(session_ids.shape)} but task {task.name!r} has {count} samples; pass one "
                             f"session id per sample ([{count}], or [n_tasks, {count}] with equal rows)")
        if task.is_negative_task:  # rank 1 - prediction by 1 - label
            predictions, labels = 1 - predictions, 1 - labels
        super()._update_task(task_index, predictions, labels, weights, session_ids=rows[0])

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      session_ids: torch.Tensor) -> Optional[Dict[str, torch.Tensor]]:
        options = {name: value for name, value in self._options.items() if name != "session_key"}
        sums = session_ndcg_sums(predictions, labels, weights, session_ids, **options)
        return None if sums is None else dict(zip(self._state_names, sums))

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        sum_ndcg, sessions = states
        return {"ndcg": sum_ndcg / sessions}


__all__ = ["NDCGComputation", "NDCGMetric", "SESSION_KEY", "session_ids_to_tensor", "session_ndcg_sums"]
