"""`RecMetric`, the base of every metric, at TorchRec's path (`torchrec.metrics.rec_metric`).

A metric keeps, per task, a *lifetime* state (everything since the last reset) and a *window* state (the
last ceil(window_size / world_size) samples of this rank). `update(predictions=..., labels=..., weights=...)`
folds one batch in; `compute()` reduces the states across ranks and returns TorchRec's keys,
`"{namespace}-{task}|{lifetime,window}_{name}"`, e.g. `"ne-click|window_ne"`. A few metrics read more per
batch, as update() keywords that every metric receives and only they read: NDCG a session id per sample in
`required_inputs={"session_id": ids}` (a model output RecMetricModule looks up: `get_required_inputs()`), GAUC
the session sizes in `num_candidates=`.

Most metrics are ratios of sums (NE, calibration, CTR, MSE): their state is a vector of weighted sums, the
window is the sum of the last batches' vectors (`WindowBuffer`, evicting whole batches as TorchRec does), and
the cross-rank reduction is one all_reduce(SUM) of every task's [lifetime, window] vectors. AUC keeps the
window's samples themselves and all-gathers them.

    >>> from rectoolkit.metrics.ctr import CTRMetric
    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> ctr = CTRMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="click")], window_size=2)
    >>> ctr.update(predictions={"click": torch.tensor([0.2, 0.9])}, labels={"click": torch.tensor([0., 1.])},
    ...            weights=None)
    >>> ctr.update(predictions={"click": torch.tensor([0.7, 0.6])}, labels={"click": torch.tensor([1., 1.])},
    ...            weights=None)
    >>> {key: round(float(value), 3) for key, value in ctr.compute().items()}
    {'ctr-click|lifetime_ctr': 0.75, 'ctr-click|window_ctr': 1.0}
"""

from __future__ import annotations

import enum
import math
from collections import deque
from typing import Any, Deque, Dict, Iterator, List, Mapping, Optional, Set, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo
from rectoolkit.metrics.metrics_namespace import compose_customized_metric_key, compose_metric_namespace

MAX_BUFFER_COUNT = 1000  # batches a window keeps at most (TorchRec's limit)
RecModelOutput = Union[torch.Tensor, Dict[str, torch.Tensor]]

# keyword arguments TorchRec's generate_metric_module passes to every metric; honoured when they ask nothing
_PASSED_BY_TORCHREC = ("enable_pt2_compile", "should_clone_update_inputs", "batch_size_stages")


# The keywords update() passes on beside predictions, labels and weights: every metric gets them all (one
# RecMetricModule.update feeds every metric) and reads its own; any other keyword is a mistake and refused.
UPDATE_KEYWORDS = frozenset({"required_inputs", "num_candidates"})


class RecMetricException(Exception):
    """A metric was fed or configured wrongly (TorchRec's exception type)."""


class MissingRequiredInputError(RecMetricException, KeyError):
    """An input a metric reads beyond labels, predictions and weights (a session id, `num_candidates`) was not
    given. A KeyError too, as TorchRec's RecMetricModule raises for a required input the model output lacks."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""


def metric_key(namespace: str, task: str, prefix: str, name: str) -> str:
    """TorchRec's metric key: `"ne-click|window_ne"` for ("ne", "click", "window", "ne") (metrics_namespace's)."""
    return compose_customized_metric_key(compose_metric_namespace(namespace, task), f"{prefix}_{name}")


def _active_group(world_size: int, process_group: Optional[Any], what: str) -> Optional[Any]:
    """The group to reduce over (None: nothing to reduce); refuses a world_size the process group denies."""
    if world_size == 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise RecMetricException(f"{what}: world_size={world_size} but torch.distributed is not initialized; "
                                 "call init_process_group on every rank first, or pass world_size=1")
    group = process_group if process_group is not None else dist.group.WORLD
    if dist.get_world_size(group) != world_size:
        raise RecMetricException(f"{what}: world_size={world_size} but the process group has "
                                 f"{dist.get_world_size(group)} ranks; pass the group's size")
    return group


def _collective_device(group: Any) -> torch.device:
    """NCCL reduces CUDA tensors only; gloo reduces CPU tensors."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor, group: Optional[Any]) -> torch.Tensor:
    """The sum of `tensor` over the ranks of `group` (the tensor itself when group is None)."""
    if group is None:
        return tensor
    reduced = tensor.to(_collective_device(group)).clone()
    dist.all_reduce(reduced, group=group)
    return reduced.to(tensor.device)


def all_gather_columns(tensor: torch.Tensor, group: Optional[Any]) -> torch.Tensor:
    """Every rank's [rows, n_r] tensor concatenated along columns (n_r may differ between ranks)."""
    if group is None:
        return tensor
    device = _collective_device(group)
    size = torch.tensor([tensor.shape[-1]], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(int(s) for s in sizes))
    padded = torch.zeros(tensor.shape[0], longest, dtype=tensor.dtype, device=device)
    padded[:, :tensor.shape[-1]] = tensor.to(device)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([part[:, :int(s)] for part, s in zip(parts, sizes)], dim=1).to(tensor.device)


class RecMetric(nn.Module):
    """One metric over one or more tasks (TorchRec's constructor).

    Args:
        world_size, my_rank: this trainer among all; compute() reduces over `process_group` (default: the
            world) when world_size > 1.
        batch_size: samples per rank per update (the local window must hold one batch).
        tasks: the RecTaskInfos; update() takes a dict {task name: [batch] tensor} per input (a task missing
            from the dict is skipped), or one [n_tasks, batch] tensor.
        compute_mode: fused modes return one 0-d value per key, the unfused mode a [1] tensor (as TorchRec).
        window_size: samples over all ranks in the window metrics.
        compute_on_all_ranks: every rank gets the values (otherwise only rank 0; every rank must still call
            compute(), which is a collective).
        fused_update_limit, should_validate_update: only their defaults (0, False) are implemented.
    """

    _namespace: str = ""
    _options: Dict[str, Any] = {}  # the metric's own keyword arguments and their defaults
    # A metric written as TorchRec's: its RecMetricComputation class (rectoolkit.metrics.computation runs it)
    _computation_class: Optional[type] = None
    # (prefix, name) of the values TorchRec reports in float32 (the window AUCs); the others are float64
    _float32_values: frozenset = frozenset()

    def __init__(self, world_size: int, my_rank: int, batch_size: int, tasks: List[RecTaskInfo],
                 compute_mode: RecComputeMode = RecComputeMode.UNFUSED_TASKS_COMPUTATION, window_size: int = 100,
                 fused_update_limit: int = 0, compute_on_all_ranks: bool = False, should_validate_update: bool = False,
                 process_group: Optional[Any] = None, **kwargs: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if not tasks:
            raise ValueError(f"{name}: tasks is empty; pass at least one RecTaskInfo")
        if world_size < 1 or not 0 <= my_rank < world_size:
            raise ValueError(f"{name}: my_rank={my_rank} is not in [0, world_size={world_size})")
        if fused_update_limit > 1:
            raise NotImplementedError(f"{name}: fused_update_limit={fused_update_limit} is not implemented "
                                      "(updates are applied at once); pass 0")
        if should_validate_update:
            raise NotImplementedError(f"{name}: should_validate_update=True is not implemented; pass False")
        self._window_size = math.ceil(window_size / world_size)
        if self._window_size < batch_size:
            raise ValueError(f"{name}: the local window ({self._window_size} samples = ceil(window_size="
                             f"{window_size} / world_size={world_size})) is smaller than batch_size={batch_size}; "
                             "raise window_size")
        self._options = dict(type(self)._options)
        for key, value in kwargs.items():
            if self._computation_class is not None:
                break  # its computations take the keywords (and refuse those they do not know)
            if key in self._options:
                self._options[key] = value
            elif key not in _PASSED_BY_TORCHREC or value:
                raise ValueError(f"{name}: unknown or unimplemented argument {key}={value!r}; "
                                 f"this metric takes {sorted(self._options) or 'no extra arguments'}")
        self._world_size, self._my_rank, self._batch_size = world_size, my_rank, batch_size
        self._tasks = list(tasks)
        self._compute_mode = compute_mode
        self._compute_on_all_ranks = compute_on_all_ranks
        self._process_group = process_group
        self._synced_states: Optional[Any] = None
        if self._computation_class is not None:
            from rectoolkit.metrics import computation  # (it imports this module)
            self._computation_required_inputs: Set[str] = set()
            for key in _PASSED_BY_TORCHREC:
                kwargs.pop(key, None)
            self._metrics_computations = computation.build_computations(self, kwargs)
        self.reset()

    # ------------------------------------------------------------------ what a metric defines
    def reset(self) -> None:
        """Forget every update (lifetime and window) and any sync()."""
        if self._computation_class is None:
            raise NotImplementedError
        for computation in self._metrics_computations:
            computation.reset()

    def _get_task_kwargs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Dict[str, Any]:
        """TorchRec's hook: keywords for the computation of these task(s), beside the metric's own."""
        return {}

    def _get_task_required_inputs(self, task_config: Union[RecTaskInfo, List[RecTaskInfo]]) -> Set[str]:
        """TorchRec's hook: the model outputs the computation of these task(s) reads (get_required_inputs)."""
        return set()

    def _update_task(self, task_index: int, predictions: torch.Tensor, labels: torch.Tensor,
                     weights: torch.Tensor, **inputs: Any) -> None:
        """Fold one task's batch in ([batch] float64 tensors; `inputs`: what `_batch_inputs` read)."""
        raise NotImplementedError

    def _local_states(self) -> Any:
        raise NotImplementedError

    def _reduce_states(self, states: Any, group: Any) -> Any:
        raise NotImplementedError

    def _task_values(self, states: Any, task_index: int) -> Iterator[Tuple[str, str, torch.Tensor]]:
        """(prefix, metric name, 0-d value) for one task."""
        raise NotImplementedError

    # ------------------------------------------------------------------ TorchRec's interface
    def get_required_inputs(self) -> Set[str]:
        """Model outputs this metric reads beyond labels, predictions and weights (NDCG: its session key);
        RecMetricModule.update passes them in `required_inputs`."""
        return set(self._computation_required_inputs) if self._computation_class is not None else set()

    def _batch_inputs(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """What this metric reads from update()'s other keywords (`required_inputs`, GAUC's `num_candidates`),
        by the name `_update_task` takes it under; none for most metrics."""
        return {}

    def update(self, *, predictions: RecModelOutput, labels: RecModelOutput, weights: Optional[RecModelOutput],
               **kwargs: Any) -> None:
        """Fold one batch in; weights None means 1 for every sample. As in TorchRec, the other keywords
        (`required_inputs={name: tensor}`, `num_candidates=...`) reach every metric, and a metric reads only its
        own (one RecMetricModule.update feeds them all); a keyword no metric reads (a misspelling) is refused."""
        kwargs.pop("_log_tensors", None)  # TorchRec's RecMetricList passes it; it only logs
        if self._computation_class is not None:  # TorchRec's update: the computation reads the keywords
            from rectoolkit.metrics import computation
            if any(c._is_synced for c in self._metrics_computations):
                raise RecMetricException(f"{type(self).__name__}.update: the metric is synced; call unsync() first")
            computation.update_computations(self, predictions, labels, weights, kwargs)
            return
        unknown = sorted(set(kwargs) - UPDATE_KEYWORDS)
        if unknown:
            raise TypeError(f"{type(self).__name__}.update got unexpected keywords {unknown}: the metrics read "
                            f"{sorted(UPDATE_KEYWORDS)} besides predictions, labels and weights")
        if self._synced_states is not None:
            raise RecMetricException(f"{type(self).__name__}.update: the metric is synced; call unsync() before "
                                     "feeding more batches")
        extra_inputs = self._batch_inputs(kwargs)
        with torch.no_grad():
            for index, task in enumerate(self._tasks):
                inputs = [_task_input(value, task, index, len(self._tasks), what)
                          for what, value in (("predictions", predictions), ("labels", labels), ("weights", weights))]
                task_predictions, task_labels, task_weights = inputs
                if task_predictions is None or task_predictions.numel() == 0:
                    continue
                if task_labels is None or task_labels.numel() != task_predictions.numel():
                    raise ValueError(f"{type(self).__name__}: task {task.name!r} has {task_predictions.numel()} "
                                     f"predictions but {0 if task_labels is None else task_labels.numel()} labels")
                if task_weights is None:
                    task_weights = torch.ones_like(task_predictions)
                elif task_weights.numel() != task_predictions.numel():
                    raise ValueError(f"{type(self).__name__}: task {task.name!r} has {task_predictions.numel()} "
                                     f"predictions but {task_weights.numel()} weights")
                self._update_task(index, task_predictions.detach().double().cpu(),
                                  task_labels.detach().double().cpu(), task_weights.detach().double().cpu(),
                                  **extra_inputs)

    def compute(self) -> Dict[str, torch.Tensor]:
        """The metrics over all ranks' updates (a collective: every rank calls it); {} on ranks other than 0
        unless compute_on_all_ranks."""
        if self._computation_class is not None:
            from rectoolkit.metrics import computation
            return computation.report_computations(self, "")
        states = self._synced_states if self._synced_states is not None else self.global_states()
        if self._my_rank != 0 and not self._compute_on_all_ranks:
            return {}
        return self._report(states)

    def local_compute(self) -> Dict[str, torch.Tensor]:
        """The metrics over this rank's updates only (no communication); over all ranks' while synced. Keys as
        TorchRec's: ``"ctr-click|local_lifetime_ctr"``."""
        if self._computation_class is not None:
            from rectoolkit.metrics import computation
            return computation.report_computations(self, "local_")
        states = self._synced_states if self._synced_states is not None else self._local_states()
        return self._report(states, key_prefix="local_")

    def global_states(self) -> Any:
        """This metric's states summed (or gathered) over the ranks: a collective when world_size > 1."""
        group = _active_group(self._world_size, self._process_group, type(self).__name__)
        return self._reduce_states(self._local_states(), group) if group is not None else self._local_states()

    def sync(self) -> None:
        """Hold all ranks' states (a collective) until unsync(): local_compute() then reports the global
        metrics, compute() communicates no more, and update() is refused."""
        if self._computation_class is not None:
            for computation in self._metrics_computations:
                computation.sync()
            return
        self._synced_states = self.global_states()

    def unsync(self) -> None:
        """Back to this rank's own states after sync()."""
        if self._computation_class is not None:
            for computation in self._metrics_computations:
                if computation._is_synced:
                    computation.unsync()
            return
        self._synced_states = None

    def get_memory_usage(self) -> Dict[torch.Tensor, int]:
        """{tensor: bytes} of every tensor this metric holds (states, window batches, computations), as TorchRec's."""
        sizes: Dict[torch.Tensor, int] = {}
        seen: Set[int] = set()
        pending: Deque[Any] = deque(self.__dict__.values())
        while pending:
            item = pending.popleft()
            if id(item) in seen or isinstance(item, (str, bytes, int, float, bool, enum.Enum, type)) or item is None:
                continue
            seen.add(id(item))
            if isinstance(item, torch.Tensor):
                sizes[item] = item.numel() * item.element_size()
            elif isinstance(item, Mapping):
                pending.extend(item.values())
            elif isinstance(item, (list, tuple, deque)):
                pending.extend(item)
            elif hasattr(item, "__dict__"):
                pending.extend(vars(item).values())
        return sizes

    def _report(self, states: Any, key_prefix: str = "") -> Dict[str, torch.Tensor]:
        fused = self._compute_mode != RecComputeMode.UNFUSED_TASKS_COMPUTATION
        per_task = [list(self._task_values(states, index)) for index in range(len(self._tasks))]
        # TorchRec's key order: fused, each value for every task before the next value; unfused, task by task
        positions = range(len(per_task[0]) if per_task else 0)
        order = ([(task, position) for position in positions for task in range(len(per_task))] if fused else
                 [(task, position) for task in range(len(per_task)) for position in positions])
        out: Dict[str, torch.Tensor] = {}
        for task, position in order:
            prefix, name, value = per_task[task][position]
            value = value.float() if (prefix, name) in self._float32_values else value.double()
            out[metric_key(self._namespace, self._tasks[task].name, key_prefix + prefix, name)] = (value.reshape(()) if fused
                                                                                     else value.view(1))
        return out


def _task_input(value: Optional[RecModelOutput], task: RecTaskInfo, index: int, n_tasks: int,
                what: str) -> Optional[torch.Tensor]:
    """One task's [batch] tensor from a {task: tensor} dict or an [n_tasks, batch] tensor."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        tensor = value.get(task.name)
        return None if tensor is None else tensor.reshape(-1)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must be a tensor or a dict of tensors by task name, got {type(value).__name__}")
    return value.reshape(n_tasks, -1)[index]


def ratio_or_zero(numerator: torch.Tensor, denominator: torch.Tensor,
                  empty: Optional[torch.Tensor] = None) -> torch.Tensor:
    """TorchRec's per-task ratio `torch.where(empty, 0.0, numerator / denominator).double()`; `empty` defaults
    to `denominator == 0` (the compute_* functions of ctr, mse, mae, accuracy, ...)."""
    if empty is None:
        empty = denominator == 0.0
    return torch.where(empty, 0.0, numerator / denominator).double()


class SumStateMetric(RecMetric):
    """A metric computed from weighted sums (`_state_names`): lifetime sums, window sums, all_reduce(SUM).

    Its maths are its module's TorchRec functions, those its computation runs too: `_batch_states` returns what
    `get_<metric>_states` says a batch adds, `_values` what `compute_<metric>` makes of the sums; this class keeps
    the sums per task, their windows, their state_dict and their reduction over the ranks.

    Its state_dict holds this rank's lifetime sums under TorchRec's keys and shapes,
    `_metrics_computations.{i}.{state}`: one computation per task of shape [1] (unfused mode), or one of shape
    [n_tasks] (fused modes); the window is not saved, so after load_state_dict it starts empty (as TorchRec's).

        >>> from rectoolkit.metrics.ctr import CTRMetric
        >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
        >>> ctr = CTRMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="click")], window_size=2)
        >>> ctr.update(predictions={"click": torch.tensor([0.2, 0.9])}, labels={"click": torch.tensor([0., 1.])},
        ...            weights=None)
        >>> {key: value.tolist() for key, value in ctr.state_dict().items()}
        {'_metrics_computations.0.ctr_num': [1.0], '_metrics_computations.0.ctr_denom': [2.0]}
    """

    _state_names: Tuple[str, ...] = ()
    _report_groups: Tuple[Tuple[str, ...], ...] = ()  # the order of compute()'s keys, as TorchRec's; () for one group

    def _persistent_states(self) -> Tuple[str, ...]:
        """The states TorchRec saves in its state_dict (all of them unless a metric says otherwise)."""
        return self._state_names

    def _saved_computations(self) -> List[Tuple[str, List[int]]]:
        """(key prefix, the task rows it holds) per computation, as TorchRec lays them out."""
        if self._compute_mode == RecComputeMode.UNFUSED_TASKS_COMPUTATION:
            return [(f"_metrics_computations.{i}.", [i]) for i in range(len(self._tasks))]
        return [("_metrics_computations.0.", list(range(len(self._tasks))))]

    # A subclass naming a `_computation_class` (TorchRec's way: `class MyNE(NEMetric): _computation_class = ...`)
    # is run by its computations (RecMetric's), which hold the states; the sum-state machinery below stays out.

    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._computation_class is not None:
            return
        for key_prefix, rows in self._saved_computations():
            for name in self._persistent_states():
                destination[prefix + key_prefix + name] = self._lifetime[rows, self._state_names.index(name)].clone()

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, local_metadata: Any, strict: bool,
                              missing_keys: List[str], unexpected_keys: List[str], error_msgs: List[str]) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if self._computation_class is not None:
            return
        loaded, errors_before = self._lifetime.clone(), len(error_msgs)
        for key_prefix, rows in self._saved_computations():
            for name in self._persistent_states():
                key = prefix + key_prefix + name
                if key in unexpected_keys:
                    unexpected_keys.remove(key)
                if key not in state_dict:
                    missing_keys.append(key)
                    continue
                value = torch.as_tensor(state_dict[key], dtype=torch.float64).cpu()
                if value.shape != (len(rows),):
                    error_msgs.append(f"{type(self).__name__}: {key} has shape {tuple(value.shape)}, expected "
                                      f"({len(rows)},) for {len(rows)} task(s) in {self._compute_mode.name}")
                    continue
                loaded[rows, self._state_names.index(name)] = value
        if len(error_msgs) == errors_before:  # a failed load changes nothing
            self._lifetime = loaded
            self._empty_windows()

    def reset(self) -> None:
        if self._computation_class is not None:
            return super().reset()
        self._lifetime = torch.zeros(len(self._tasks), len(self._state_names), dtype=torch.float64)
        self._empty_windows()
        self._synced_states = None

    def _empty_windows(self) -> None:
        """Per task, the window's sums and the batches in them (TorchRec's WindowBuffer)."""
        self._window_sums = [torch.zeros(len(self._state_names), dtype=torch.float64) for _ in self._tasks]
        self._windows = [WindowBuffer(self._window_size) for _ in self._tasks]

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **inputs: Any) -> Optional[Dict[str, torch.Tensor]]:
        """{state: the batch's sum} (inputs: one task's [batch] float64 tensors, and what `_batch_inputs` read);
        None when the batch adds nothing, not even to the window (NDCG without a session)."""
        raise NotImplementedError

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        """{metric name: value} from a task's summed states (in the order of `_state_names`)."""
        raise NotImplementedError

    def _window_samples(self, predictions: torch.Tensor) -> int:
        """The samples a task's batch counts for in its window."""
        return predictions.numel()

    def _update_task(self, task_index: int, predictions: torch.Tensor, labels: torch.Tensor,
                     weights: torch.Tensor, **inputs: Any) -> None:
        sums = self._batch_states(predictions, labels, weights, **inputs)
        if sums is None:
            return
        batch = torch.stack([sums[name].double().reshape(()) for name in self._state_names])
        self._lifetime[task_index] += batch
        self._windows[task_index].aggregate_state(self._window_sums[task_index], batch,
                                                  self._window_samples(predictions))

    def _local_states(self) -> torch.Tensor:
        """[tasks, 2 (lifetime, window), states]."""
        return torch.stack([self._lifetime, torch.stack(self._window_sums)], dim=1)

    def _reduce_states(self, states: torch.Tensor, group: Any) -> torch.Tensor:
        return all_reduce_sum(states, group)

    def _task_values(self, states: torch.Tensor, task_index: int) -> Iterator[Tuple[str, str, torch.Tensor]]:
        by_prefix = {prefix: self._values(states[task_index, slot])
                     for slot, prefix in enumerate(("lifetime", "window"))}
        names = list(by_prefix["lifetime"])
        # TorchRec's key order: each group of values lifetime then window (NE: ne, then logloss)
        groups = [[name for name in group if name in names] for group in self._report_groups] or [names]
        for group in groups:
            for prefix in ("lifetime", "window"):
                for name in group:
                    yield prefix, name, by_prefix[prefix][name]


class RecMetricList(nn.Module):
    """Several metrics fed and computed together (TorchRec's `RecMetricList`)."""

    def __init__(self, rec_metrics: List[RecMetric]) -> None:
        super().__init__()
        self.rec_metrics = nn.ModuleList(rec_metrics)

    def __len__(self) -> int:
        return len(self.rec_metrics)

    def __getitem__(self, index: int) -> nn.Module:
        return self.rec_metrics[index]

    def update(self, *, predictions: RecModelOutput, labels: RecModelOutput, weights: Optional[RecModelOutput],
               **kwargs: Any) -> None:
        """Feed one batch to every metric, with the same other keywords (`required_inputs`, `num_candidates`)."""
        for metric in self.rec_metrics:
            metric.update(predictions=predictions, labels=labels, weights=weights, **kwargs)

    def get_required_inputs(self) -> Optional[List[str]]:
        """The extra model outputs the metrics read (TorchRec's: None when there are none)."""
        required = sorted(set().union(*(metric.get_required_inputs() for metric in self.rec_metrics)))
        return required or None

    def compute(self) -> Dict[str, torch.Tensor]:
        """Every metric's compute(), in one dict."""
        return {key: value for metric in self.rec_metrics for key, value in metric.compute().items()}

    def local_compute(self) -> Dict[str, torch.Tensor]:
        """Every metric's local_compute(), in one dict."""
        return {key: value for metric in self.rec_metrics for key, value in metric.local_compute().items()}

    def sync(self) -> None:
        """sync() every metric (a collective)."""
        for metric in self.rec_metrics:
            metric.sync()

    def unsync(self) -> None:
        """unsync() every metric."""
        for metric in self.rec_metrics:
            metric.unsync()

    def reset(self) -> None:
        """Reset every metric."""
        for metric in self.rec_metrics:
            metric.reset()


from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation  # noqa: E402  (TorchRec's path)
from rectoolkit.metrics.computation import WindowStateBuffer as WindowBuffer  # noqa: E402  (TorchRec's name and path)

__all__ = ["MAX_BUFFER_COUNT", "ratio_or_zero", "MetricComputationReport", "MissingRequiredInputError", "RecMetric",
           "RecMetricComputation", "RecMetricException", "RecMetricList", "SumStateMetric", "WindowBuffer", "metric_key"]
