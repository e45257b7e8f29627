"""`RecMetricComputation`, what a custom TorchRec metric subclasses (`torchrec.metrics.rec_metric`), and how a
RecMetric runs one.

A TorchRec metric is two classes: a RecMetricComputation that holds the states and does the math (`update()` folds
a batch into the states, `_compute()` reports values), and a RecMetric that names the namespace and the
computation class and feeds it. The RecMetric builds one computation per task (unfused mode, states of one row)
or one for all tasks (fused modes, a row per task), passes each batch as [n_tasks, batch] tensors in the dtypes
given, and asks the computations for their reports in compute(), reduced across ranks by each state's
`dist_reduce_fx`. rectoolkit's own metrics are written another way (rec_metric.SumStateMetric); this is the
contract TorchRec's users write against, so that their metrics run here unchanged:

    >>> import torch
    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
    >>> from rectoolkit.metrics.rec_metric import RecMetric
    >>> class SumComputation(RecMetricComputation):
    ...     def __init__(self, *args, **kwargs):
    ...         super().__init__(*args, **kwargs)
    ...         self._add_state("total", torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
    ...                         dist_reduce_fx="sum", persistent=True)
    ...     def update(self, *, predictions, labels, weights, **kwargs):
    ...         batch_total = torch.sum(labels * weights, dim=-1).double()
    ...         self.total += batch_total
    ...         self._aggregate_window_state("total", batch_total, predictions.shape[-1])
    ...     def _compute(self):
    ...         return [MetricComputationReport(MetricName.CTR, MetricPrefix.LIFETIME, self.total),
    ...                 MetricComputationReport(MetricName.CTR, MetricPrefix.WINDOW, self.get_window_state("total"))]
    >>> class SumMetric(RecMetric):
    ...     _namespace = MetricNamespace.CTR
    ...     _computation_class = SumComputation
    >>> metric = SumMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="click")], window_size=2)
    >>> for labels in ([1.0, 1.0], [0.0, 1.0]):
    ...     metric.update(predictions={"click": torch.tensor([0.5, 0.5])}, labels={"click": torch.tensor(labels)},
    ...                   weights=None)
    >>> {key: value.tolist() for key, value in metric.compute().items()}
    {'ctr-click|lifetime_ctr': [3.0], 'ctr-click|window_ctr': [1.0]}
"""

from __future__ import annotations

import abc
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.metrics.metrics_config import RecComputeMode
from rectoolkit.metrics.metrics_namespace import MetricNameBase, MetricPrefix, compose_metric_key

MAX_BUFFER_COUNT = 1000  # batches a window keeps at most (TorchRec's limit)
_REDUCTIONS = ("sum", "mean", "max", "min", "cat")
_FUSED = (RecComputeMode.FUSED_TASKS_COMPUTATION, RecComputeMode.FUSED_TASKS_AND_STATES_COMPUTATION)


@dataclass(frozen=True)
class MetricComputationReport:
    """One value a computation reports: its name, lifetime or window prefix, and value (one entry per task)."""

    name: MetricNameBase
    metric_prefix: MetricPrefix
    value: torch.Tensor
    description: Optional[str] = None


class WindowStateBuffer:
    """The last batches of one window state, TorchRec's `WindowBuffer`: `aggregate_state` adds a batch's state to
    the window tensor in place and takes out the oldest batches beyond `max_size` samples."""

    def __init__(self, max_size: int, max_buffer_count: int = MAX_BUFFER_COUNT) -> None:
        self._max_size = max_size
        self._buffers: Deque[torch.Tensor] = deque(maxlen=max_buffer_count)
        self._used_sizes: Deque[int] = deque(maxlen=max_buffer_count)
        self._window_used_size = 0

    def aggregate_state(self, window_state: torch.Tensor, curr_state: torch.Tensor, size: int) -> None:
        if len(self._buffers) == self._buffers.maxlen:
            self._remove_oldest(window_state)
        self._buffers.append(curr_state.clone())
        self._used_sizes.append(size)
        window_state += curr_state
        self._window_used_size += size
        while self._window_used_size > self._max_size:
            self._remove_oldest(window_state)

    def _remove_oldest(self, window_state: torch.Tensor) -> None:
        window_state -= self._buffers.popleft()
        self._window_used_size -= self._used_sizes.popleft()

    @property
    def buffers(self) -> Deque[torch.Tensor]:
        return self._buffers


class RecMetricComputation(nn.Module, abc.ABC):
    """The states and math of one metric over `n_tasks` tasks (TorchRec's constructor and methods).

    A subclass adds its states in `__init__` with `_add_state` (each a tensor whose first dimension is
    `self._n_tasks`, or a list for `dist_reduce_fx="cat"`), folds a batch in with `update()` (predictions, labels
    and weights of shape [n_tasks, batch]; `_aggregate_window_state` for the window), and reports with
    `_compute()`. compute() runs `_compute()` on the states reduced over the process group's ranks (on rank 0
    only, unless compute_on_all_ranks); local_compute() on this rank's.
    """

    def __init__(self, my_rank: int, batch_size: int, n_tasks: int, window_size: int,
                 compute_on_all_ranks: bool = False, should_validate_update: bool = False,
                 compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION,
                 process_group: Optional[Any] = None, fused_update_limit: int = 0,
                 allow_missing_label_with_zero_weight: bool = False, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self._enable_pt2_compile: bool = bool(kwargs.pop("enable_pt2_compile", False))
        if args or kwargs:  # TorchRec hands these to torchmetrics.Metric, which refuses what it does not know too
            raise TypeError(f"{type(self).__name__}: unexpected arguments {list(args) + sorted(kwargs)}; a "
                            "computation takes TorchRec's arguments, and its own ones by name in its __init__")
        if should_validate_update:
            raise NotImplementedError(f"{type(self).__name__}: should_validate_update=True is not implemented")
        self._my_rank, self._n_tasks, self._batch_size = my_rank, n_tasks, batch_size
        self._window_size = window_size
        self._compute_on_all_ranks = compute_on_all_ranks
        self._should_validate_update = should_validate_update
        self._compute_mode = compute_mode
        self._process_group = process_group
        self._fused_update_limit = fused_update_limit
        self._allow_missing_label_with_zero_weight = allow_missing_label_with_zero_weight
        self._defaults: Dict[str, Union[torch.Tensor, list]] = {}
        self._reductions: Dict[str, Union[str, Callable, None]] = {}
        self._batch_window_buffers: Optional[Dict[str, WindowStateBuffer]] = {} if window_size > 0 else None
        self._local_copies: Optional[Dict[str, Any]] = None  # this rank's states while synced

    # ------------------------------------------------------------------ states
    def add_state(self, name: str, default: Union[torch.Tensor, list], dist_reduce_fx: Union[str, Callable, None] = None,
                  persistent: bool = False) -> None:
        """A state `self.<name>`: a tensor (a buffer, in the state_dict when persistent) or a list (for "cat")."""
        if isinstance(dist_reduce_fx, str) and dist_reduce_fx not in _REDUCTIONS:
            raise ValueError(f"{type(self).__name__}: state {name!r} has dist_reduce_fx={dist_reduce_fx!r}; use one "
                             f"of {_REDUCTIONS}, a callable over the ranks' stacked states, or None")
        if isinstance(default, list):
            if default:
                raise ValueError(f"{type(self).__name__}: a list state ({name!r}) must start empty")
            setattr(self, name, [])
        elif isinstance(default, torch.Tensor):
            self.register_buffer(name, default.detach().clone(), persistent=persistent)
        else:
            raise ValueError(f"{type(self).__name__}: state {name!r} must default to a tensor or [], got "
                             f"{type(default).__name__}")
        self._defaults[name] = default.detach().clone() if isinstance(default, torch.Tensor) else []
        self._reductions[name] = dist_reduce_fx

    def _add_state(self, name: str, default: Union[torch.Tensor, list], add_window_state: bool, **kwargs: Any) -> None:
        """TorchRec's: the state, and with add_window_state a non-persistent `window_<name>` beside it."""
        self.add_state(name, default, **kwargs)
        if add_window_state:
            if self._batch_window_buffers is None:
                raise RuntimeError("Users is adding a window state while window metric is disabled.")
            if not isinstance(default, torch.Tensor):
                raise ValueError(f"{type(self).__name__}: the window state of {name!r} needs a tensor default")
            kwargs["persistent"] = False
            window_name = self.get_window_state_name(name)
            self.add_state(window_name, default.detach().clone(), **kwargs)
            self._batch_window_buffers[window_name] = WindowStateBuffer(self._window_size)

    @staticmethod
    def get_window_state_name(state_name: str) -> str:
        return f"window_{state_name}"

    def get_window_state(self, state_name: str) -> torch.Tensor:
        return getattr(self, self.get_window_state_name(state_name))

    def _aggregate_window_state(self, state_name: str, state: torch.Tensor, num_samples: int) -> None:
        """Add one batch's `state` (of `num_samples` samples) to the window of `state_name`."""
        if self._batch_window_buffers is None:
            raise RuntimeError("Users is adding a window state while window metric is disabled.")
        window_name = self.get_window_state_name(state_name)
        if window_name not in self._batch_window_buffers:
            raise KeyError(f"{type(self).__name__}: {state_name!r} has no window state; add it with "
                           f"_add_state({state_name!r}, ..., add_window_state=True)")
        self._batch_window_buffers[window_name].aggregate_state(getattr(self, window_name), state, num_samples)

    def _maybe_compile(self, fn: Callable) -> Callable:
        return torch.compile(fn) if self._enable_pt2_compile else fn

    # ------------------------------------------------------------------ what a subclass writes
    @abc.abstractmethod
    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        ...

    @abc.abstractmethod
    def _compute(self) -> List[MetricComputationReport]:
        ...

    def pre_compute(self) -> None:
        """Work on the local states before they are reduced and computed (none by default)."""

    # ------------------------------------------------------------------ reports
    def compute(self) -> List[MetricComputationReport]:
        """The reports over every rank's states (a collective when the process group has several ranks)."""
        synced_here = self._local_copies is None
        if synced_here:
            self.sync()
        try:
            return self._compute() if self._my_rank == 0 or self._compute_on_all_ranks else []
        finally:
            if synced_here:
                self.unsync()

    def local_compute(self) -> List[MetricComputationReport]:
        return self._compute()

    def reset(self) -> None:
        for name, default in self._defaults.items():
            setattr(self, name, default.clone() if isinstance(default, torch.Tensor) else [])
        if self._batch_window_buffers is not None:
            self._batch_window_buffers = {name: WindowStateBuffer(self._window_size)
                                          for name in self._batch_window_buffers}
        self._local_copies = None

    @property
    def _is_synced(self) -> bool:
        return self._local_copies is not None

    def sync(self) -> None:
        """Hold the states reduced over the ranks (by each state's dist_reduce_fx) until unsync()."""
        if self._local_copies is not None:
            raise RecMetricComputationError(f"{type(self).__name__} is already synced; call unsync() first")
        self._local_copies = {name: getattr(self, name) for name in self._defaults}
        group = _group_of(self._process_group)
        if group is None:
            return
        for name in self._defaults:
            setattr(self, name, _reduce(getattr(self, name), self._reductions[name], group))

    def unsync(self) -> None:
        if self._local_copies is None:
            raise RecMetricComputationError(f"{type(self).__name__} is not synced; call sync() first")
        for name, value in self._local_copies.items():
            setattr(self, name, value)
        self._local_copies = None


class RecMetricComputationError(RuntimeError):
    """sync() / unsync() called out of turn."""


def _group_of(process_group: Optional[Any]) -> Optional[Any]:
    """The group to reduce over, None when there is nothing to reduce (as torchmetrics: not initialized, 1 rank)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = process_group if process_group is not None else dist.group.WORLD
    return group if dist.get_world_size(group) > 1 else None


def _reduce(state: Union[torch.Tensor, list], reduction: Union[str, Callable, None], group: Any) -> Any:
    """One state over the ranks of `group`, as torchmetrics reduces it."""
    if isinstance(state, list) and callable(reduction):
        return _reduce_list(state, reduction, group)
    if isinstance(state, list):
        state = torch.cat(state) if state else torch.empty(0)
    if reduction in ("sum", "max", "min"):
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
        reduced = state.to(device).clone()
        op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[reduction]
        dist.all_reduce(reduced, op=op, group=group)
        return reduced.to(state.device)
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, state.cpu(), group=group)
    gathered = [tensor.to(state.device) for tensor in gathered]
    if reduction == "cat":
        return torch.cat(gathered)
    stacked = torch.stack(gathered)
    if reduction == "mean":
        return stacked.mean(0)
    return reduction(stacked) if callable(reduction) else stacked


def _reduce_list(state: list, reduction: Callable, group: Any) -> Any:
    """A list state with a callable reduction, as torchmetrics: each element gathered from every rank, the
    gathered tensors in element-major order (element 0 of each rank, then element 1, ...) given to `reduction`."""
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, [tensor.cpu() for tensor in state], group=group)
    lengths = [len(rank_state) for rank_state in gathered]
    if len(set(lengths)) > 1:
        raise RecMetricComputationError(f"a list state holds {lengths} tensors on ranks 0..{len(lengths) - 1}; "
                                        "torchmetrics gathers them element by element, so every rank needs as many "
                                        "(concatenate the list before sync(), as AUCMetricComputation does)")
    device = state[0].device if state else torch.device("cpu")
    return reduction([rank_state[index].to(device) for index in range(lengths[0]) for rank_state in gathered])


# ---------------------------------------------------------------------- a RecMetric with a _computation_class
def build_computations(metric: Any, kwargs: Dict[str, Any]) -> nn.ModuleList:
    """One computation per task (unfused) or one for all (fused), with TorchRec's arguments and the metric's
    other keywords and `_get_task_kwargs`."""
    fused = metric._compute_mode in _FUSED
    computations = nn.ModuleList()
    for task_config in ([metric._tasks] if fused else metric._tasks):
        computations.append(metric._computation_class(
            my_rank=metric._my_rank, batch_size=metric._batch_size, n_tasks=len(metric._tasks) if fused else 1,
            window_size=metric._window_size, compute_on_all_ranks=metric._compute_on_all_ranks,
            should_validate_update=False, compute_mode=metric._compute_mode, process_group=metric._process_group,
            fused_update_limit=0, **{**kwargs, **metric._get_task_kwargs(task_config)}))
        metric._computation_required_inputs.update(metric._get_task_required_inputs(task_config))
    return computations


def update_computations(metric: Any, predictions: Any, labels: Any, weights: Any, kwargs: Dict[str, Any]) -> None:
    """TorchRec's RecMetric update: [n_tasks, batch] tensors to the fused computation, [1, batch] per task
    otherwise (tasks missing from the dicts skipped), weights 1 where none are given."""
    tasks = metric._tasks
    with torch.no_grad():
        if metric._compute_mode in _FUSED:
            names = [task.name for task in tasks]

            def stacked(value: Any) -> torch.Tensor:
                return value if isinstance(value, torch.Tensor) else torch.stack([value[name] for name in names])

            predictions, labels = stacked(predictions), stacked(labels)
            predictions = (predictions.view(len(tasks), -1) if predictions.dim() == labels.dim()
                           else predictions.view(len(tasks), -1, predictions.size(-1)))  # multiclass
            labels = labels.view(len(tasks), -1)
            weights = torch.ones_like(predictions) if weights is None else stacked(weights).view(len(tasks), -1)
            required = kwargs.get("required_inputs")
            if required is not None:
                targets = [required[task.tensor_name] for task in tasks if task.tensor_name in required]
                if targets:
                    kwargs["required_inputs"] = {**required,
                                                 "target_tensor": torch.stack(targets).view(len(tasks), -1)}
            metric._metrics_computations[0].update(predictions=predictions, labels=labels, weights=weights, **kwargs)
            return
        if isinstance(predictions, torch.Tensor):
            raise TypeError(f"{type(metric).__name__}: in UNFUSED_TASKS_COMPUTATION mode predictions, labels and "
                            "weights are dicts {task name: tensor} (as TorchRec's)")
        required = kwargs.get("required_inputs")
        for task, computation in zip(tasks, metric._metrics_computations):
            if task.name not in predictions or predictions[task.name].numel() == 0:
                continue
            task_predictions = predictions[task.name]
            task_labels = labels[task.name].view(1, -1)
            task_predictions = (task_predictions.view(1, -1) if task_predictions.dim() == labels[task.name].dim()
                                else task_predictions.view(1, -1, task_predictions.size(-1)))
            task_weights = torch.ones_like(task_predictions) if weights is None else weights[task.name].view(1, -1)
            if required is not None:
                _check_required_lengths(metric, task.name, required, task_labels.numel())
                kwargs["required_inputs"] = {k: v.view(task_labels.size()) if v.numel() > 1 else
                                             v.expand(task_labels.size()) for k, v in required.items()}
            computation.update(predictions=task_predictions, labels=task_labels, weights=task_weights, **kwargs)


def _check_required_lengths(metric: Any, task_name: str, required: Dict[str, torch.Tensor], num_samples: int) -> None:
    """Unfused, each required input is laid out as the task's [1, batch] labels (one value, or one per sample), as
    TorchRec's; refuse another length by name (TorchRec: a bare RuntimeError from view)."""
    for name, value in required.items():
        if value.numel() not in (1, num_samples):
            raise ValueError(f"{type(metric).__name__}: task {task_name!r}: required input {name!r} has "
                             f"{value.numel()} values but the task's batch has {num_samples} samples (its labels "
                             "and predictions); pass one value per sample, or a single value for all")


def report_computations(metric: Any, scope: str) -> Dict[str, torch.Tensor]:
    """compute() (scope "") or local_compute() (scope "local_"): TorchRec's keys, each task's value."""
    out: Dict[str, torch.Tensor] = {}
    fused = metric._compute_mode in _FUSED
    for index, computation in enumerate(metric._metrics_computations):
        computation.pre_compute()
        for report in getattr(computation, scope + "compute")():
            for task, value in (zip(metric._tasks, report.value) if fused else [(metric._tasks[index], report.value)]):
                key = compose_metric_key(metric._namespace, task.name, report.name,
                                         scope + report.metric_prefix.value, report.description)
                out[key] = value
    return out


__all__ = ["MetricComputationReport", "RecMetricComputation", "RecMetricComputationError", "WindowStateBuffer"]
