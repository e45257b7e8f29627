"""RecMetricModule's pre-compute states (TorchRec's `get_pre_compute_states` / `load_pre_compute_states`): every
sum-state metric's lifetime and window sums (a metric written as TorchRec's computations: each of their states, by
its dist_reduce_fx), reduced over the ranks, in TorchRec's nested layout

    {metric namespace: {task name: {state name: tensor}}}

with, per state, its lifetime sum under its TorchRec name and its window sum under ``window_<name>``. One entry
per task of shape [1] (unfused tasks), or, in the fused modes, one entry under the first task holding all tasks
([n_tasks]), as TorchRec lays out its metric computations.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from rectoolkit.metrics.rec_metric import RecMetric, SumStateMetric

States = Dict[str, Dict[str, Dict[str, torch.Tensor]]]


def _sum_state_metric(metric: RecMetric) -> SumStateMetric:
    if not isinstance(metric, SumStateMetric):
        raise NotImplementedError(f"RecMetricModule: pre-compute states of {type(metric).__name__} are not "
                                  "implemented (only the sum-state metrics: NE, NE positive, CTR, calibration, MSE, MAE, "
                                  "accuracy, precision, recall, weighted average, GAUC, NDCG)")
    return metric


def _computations(metric: SumStateMetric) -> List[Tuple[str, List[int]]]:
    """(task name the entry is keyed by, the task rows it holds) per TorchRec metric computation."""
    return [(metric._tasks[rows[0]].name, rows) for _, rows in metric._saved_computations()]


def get_pre_compute_states(metrics: List[RecMetric]) -> States:
    """The states of every metric, reduced over the ranks (a collective: every rank calls it)."""
    states: States = {}
    for rec_metric in metrics:
        if rec_metric._computation_class is not None:
            states[str(rec_metric._namespace)] = _computation_states(rec_metric)
            continue
        metric = _sum_state_metric(rec_metric)
        reduced = metric.global_states()  # [tasks, (lifetime, window), states]
        per_task: Dict[str, Dict[str, torch.Tensor]] = {}
        for task_name, rows in _computations(metric):
            entry = per_task.setdefault(task_name, {})
            for position, name in enumerate(metric._state_names):
                entry[name] = reduced[rows, 0, position].clone()
                entry[f"window_{name}"] = reduced[rows, 1, position].clone()
        states[metric._namespace] = per_task
    return states


def load_pre_compute_states(metrics: List[RecMetric], source: States) -> None:
    """Set every metric's lifetime and window sums from ``source`` (no collective). The loaded window counts as
    full: the batches fed next push it out as they fill the window."""
    for rec_metric in metrics:
        if rec_metric._computation_class is not None:
            _load_computation_states(rec_metric, source)
            continue
        metric = _sum_state_metric(rec_metric)
        if metric._namespace not in source:
            raise KeyError(f"load_pre_compute_states: no states for metric {metric._namespace!r}; the source has "
                           f"{sorted(source)}")
        per_task = source[metric._namespace]
        lifetime = metric._lifetime.clone()
        window = torch.zeros_like(lifetime)
        for task_name, rows in _computations(metric):
            if task_name not in per_task:
                raise KeyError(f"load_pre_compute_states: metric {metric._namespace!r} has no states for task "
                               f"{task_name!r}; the source has {sorted(per_task)}")
            entry = per_task[task_name]
            for position, name in enumerate(metric._state_names):
                for target, key in ((lifetime, name), (window, f"window_{name}")):
                    if key not in entry:
                        raise KeyError(f"load_pre_compute_states: metric {metric._namespace!r}, task {task_name!r} "
                                       f"has no state {key!r}; it has {sorted(entry)}")
                    target[rows, position] = torch.as_tensor(entry[key], dtype=torch.float64).cpu().reshape(-1)
        metric._lifetime = lifetime
        metric._empty_windows()
        for task_index, buffer in enumerate(metric._windows):
            buffer.aggregate_state(metric._window_sums[task_index], window[task_index], metric._window_size)


# ---------------------------------------------------------------------- metrics written as TorchRec's computations
def _computation_states(metric: RecMetric) -> Dict[str, Dict[str, torch.Tensor]]:
    """{task: {state: value}} of every state of each computation (window states included), reduced over the ranks
    by the state's dist_reduce_fx, keyed by the first task of each computation, as TorchRec's."""
    from rectoolkit.metrics.computation import _group_of, _reduce

    group = _group_of(metric._process_group)
    per_task: Dict[str, Dict[str, torch.Tensor]] = {}
    for task, computation in zip(metric._tasks, metric._metrics_computations):
        entry = per_task.setdefault(task.name, {})
        for name, reduction in computation._reductions.items():
            value = getattr(computation, name)
            if group is not None:
                entry[name] = _reduce(value, reduction, group)
            else:
                entry[name] = (torch.cat(value) if value else []) if isinstance(value, list) else value.clone()
    return per_task


def _load_computation_states(metric: RecMetric, source: States) -> None:
    """Set each computation's states from ``source`` as TorchRec's: the window buffers are not restored."""
    namespace = str(metric._namespace)
    if namespace not in source:
        raise KeyError(f"load_pre_compute_states: no states for metric {namespace!r}; the source has {sorted(source)}")
    for task, computation in zip(metric._tasks, metric._metrics_computations):
        if task.name not in source[namespace]:
            raise KeyError(f"load_pre_compute_states: metric {namespace!r} has no states for task {task.name!r}; "
                           f"the source has {sorted(source[namespace])}")
        for name, value in source[namespace][task.name].items():
            setattr(computation, name, value)
