"""NE per segment (`torchrec.metrics.segmented_ne.SegmentedNEMetric`): NE (see ne.py) of each group of samples, the
group of a sample given by a grouping key, an integer in [0, num_groups) per sample read from the model output
(a required input, `required_inputs={"grouping_keys": keys}` when fed directly).

Keys as TorchRec's: `segmented_ne-{task}|{lifetime,window}_segmented_ne_{group}` (float32, as TorchRec reports
them; an empty group is nan), and with include_logloss `..._logloss_{group}` (float64, 0 for an empty group). Several
grouping keys may be given (`grouping_keys=["age", {"name": "country", "num_groups": 5}]` or GroupingKeyConfigs):
then each key's states are prefixed `{key}_` and its metric keys end in `@{key}`. Float keys are refused unless
cast_keys_to_int; a key outside [0, num_groups) is refused by name (TorchRec: an IndexError, or a negative key
silently counted in a group from the end).

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = SegmentedNEMetric(world_size=1, my_rank=0, batch_size=4, tasks=[RecTaskInfo(name="t")],
    ...                            num_groups=2)
    >>> metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.5, 0.25])},
    ...               labels={"t": torch.tensor([1., 0., 1., 0.])}, weights=None,
    ...               required_inputs={"grouping_keys": torch.tensor([0, 0, 1, 1])})
    >>> {key: round(float(value), 3) for key, value in metric.compute().items() if "lifetime" in key}
    {'segmented_ne-t|lifetime_segmented_ne_0': 1.0, 'segmented_ne-t|lifetime_segmented_ne_1': 0.708}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import torch

from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_config import RecComputeMode
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.ne import ETA, compute_cross_entropy, compute_logloss, cross_entropy_bits, normalized_entropy
from rectoolkit.metrics.rec_metric import RecMetric, RecMetricException
from rectoolkit.metrics.serving_ne import checked_batch

_STATES = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")
_DEFAULT_KEY = "grouping_keys"


@dataclass
class GroupingKeyConfig:
    """One grouping key: the model output holding it, its number of groups, and whether float keys are cast to int64."""

    name: str
    num_groups: int = 1
    cast_keys_to_int: bool = False


GroupingKeys = Union[str, List[str], List[Dict[str, Any]], List[GroupingKeyConfig]]


def compute_ne_helper(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
                      neg_labels: torch.Tensor, eta: float) -> torch.Tensor:
    """`torchrec.metrics.segmented_ne.compute_ne_helper`: NE from the four sums (float64)."""
    return normalized_entropy(ce_sum, weighted_num_samples, pos_labels, neg_labels, eta)


def compute_ne(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
               neg_labels: torch.Tensor, num_groups: int, eta: float) -> torch.Tensor:
    """`torchrec.metrics.segmented_ne.compute_ne`: the NE of each of num_groups groups ([num_groups] float32)."""
    result = torch.zeros(num_groups)
    result[:] = normalized_entropy(ce_sum[:num_groups], weighted_num_samples[:num_groups], pos_labels[:num_groups],
                                   neg_labels[:num_groups], eta)
    return result


def compute_ne_fused(ce_sum: torch.Tensor, weighted_num_samples: torch.Tensor, pos_labels: torch.Tensor,
                     neg_labels: torch.Tensor, num_groups: int, n_tasks: int, eta: float) -> torch.Tensor:
    """`torchrec.metrics.segmented_ne.compute_ne_fused`: per task and group ([n_tasks, num_groups] float32)."""
    result = torch.zeros([n_tasks, num_groups])
    result[:] = normalized_entropy(ce_sum[:, :num_groups], weighted_num_samples[:, :num_groups],
                                   pos_labels[:, :num_groups], neg_labels[:, :num_groups], eta)
    return result


def get_segemented_ne_states_fused(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                                   grouping_keys: torch.Tensor, eta: float, num_groups: int,
                                   n_tasks: int) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.segmented_ne.get_segemented_ne_states_fused` (TorchRec's spelling): NE's four sums per
    task and group ([n_tasks, batch] inputs, grouping_keys [batch] -> [n_tasks, num_groups] float64)."""
    index = grouping_keys.long().unsqueeze(0).expand(n_tasks, -1)
    per_sample = {"cross_entropy_sum": cross_entropy_bits(labels, predictions, weights, eta),
                  "weighted_num_samples": weights, "pos_labels": weights * labels,
                  "neg_labels": weights * (1.0 - labels)}
    return {state: torch.zeros(n_tasks, num_groups, dtype=torch.double, device=values.device).scatter_add_(
        1, index, values.double()) for state, values in per_sample.items()}


def get_segemented_ne_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                             grouping_keys: torch.Tensor, eta: float, num_groups: int) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.segmented_ne.get_segemented_ne_states`: one task's ([batch] inputs) four sums per group
    ([num_groups] float32, as TorchRec's)."""
    states = get_segemented_ne_states_fused(labels.view(1, -1), predictions.view(1, -1), weights.view(1, -1),
                                            grouping_keys, eta, num_groups, 1)
    return {state: values[0].float() for state, values in states.items()}


def _normalize_grouping_keys_config(grouping_keys: GroupingKeys, num_groups: int,
                                    cast_keys_to_int: bool) -> List[GroupingKeyConfig]:
    """TorchRec's: a name, names, dicts (name, optional num_groups and cast_keys_to_int) or GroupingKeyConfigs, as
    GroupingKeyConfigs (num_groups and cast_keys_to_int the defaults); refuses what cannot be a key by name."""
    items = [grouping_keys] if isinstance(grouping_keys, str) else list(grouping_keys)
    configs = []
    for item in items:
        if isinstance(item, str):
            configs.append(GroupingKeyConfig(item, num_groups, cast_keys_to_int))
        elif isinstance(item, dict):
            if "name" not in item:
                raise ValueError(f"SegmentedNEMetric: grouping_keys item {item!r} has no 'name'; give "
                                 "{'name': <model output>, 'num_groups': n}")
            configs.append(GroupingKeyConfig(item["name"], item.get("num_groups", num_groups),
                                             item.get("cast_keys_to_int", cast_keys_to_int)))
        elif isinstance(item, GroupingKeyConfig):
            configs.append(item)
        else:
            raise ValueError(f"Invalid grouping_keys item type: {type(item)}. Expected str, dict, or GroupingKeyConfig.")
    if not configs:
        raise ValueError("SegmentedNEMetric: grouping_keys is empty; name at least one model output")
    names = [config.name for config in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"SegmentedNEMetric: grouping_keys names {names} repeat a key; name each once")
    for config in configs:
        if isinstance(config.num_groups, bool) or not isinstance(config.num_groups, int) or config.num_groups < 1:
            raise ValueError(f"SegmentedNEMetric: grouping key {config.name!r} has num_groups={config.num_groups!r}; "
                             "it must be a positive int")
    return configs


def grouping_key_names(kwargs: Dict[str, Any]) -> List[str]:
    """The model outputs a SegmentedNEMetric with these keyword arguments reads."""
    configs = _normalize_grouping_keys_config(kwargs.get("grouping_keys", _DEFAULT_KEY), kwargs.get("num_groups", 1),
                                              kwargs.get("cast_keys_to_int", False))
    return [config.name for config in configs]


class SegmentedNEMetricComputation(RecMetricComputation):
    """Per grouping key, NE's four sums per task and group ([n_tasks, num_groups] states, windowed)."""

    def __init__(self, *args: Any, include_logloss: bool = False, num_groups: int = 1,
                 grouping_keys: GroupingKeys = _DEFAULT_KEY, cast_keys_to_int: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self._allow_missing_label_with_zero_weight:
            raise ValueError("SegmentedNEMetric: allow_missing_label_with_zero_weight=True is not supported: TorchRec "
                             "1.8's SegmentedNEMetric ignores it (an empty group's NE is nan); leave it False")
        self._include_logloss = include_logloss
        self._grouping_key_configs = _normalize_grouping_keys_config(grouping_keys, num_groups, cast_keys_to_int)
        # TorchRec's naming: no prefix / suffix for one key given as a string or named "grouping_keys"
        self._is_single_default_key = isinstance(grouping_keys, str) or (
            len(self._grouping_key_configs) == 1 and self._grouping_key_configs[0].name == _DEFAULT_KEY)
        self._num_groups = self._grouping_key_configs[0].num_groups
        self._grouping_keys = self._grouping_key_configs[0].name
        self._cast_keys_to_int = cast_keys_to_int
        self.eta = ETA
        for config in self._grouping_key_configs:
            for state in _STATES:
                self._add_state(self._state_prefix(config) + state,
                                torch.zeros((self._n_tasks, config.num_groups), dtype=torch.double),
                                add_window_state=True, dist_reduce_fx="sum", persistent=True)

    def _state_prefix(self, config: GroupingKeyConfig) -> str:
        return "" if self._is_single_default_key else f"{config.name}_"

    def _description_suffix(self, config: GroupingKeyConfig) -> str:
        return "" if self._is_single_default_key else f"@{config.name}"

    def _group_of_each_sample(self, config: GroupingKeyConfig, required_inputs: Dict[str, Any],
                              num_samples: int) -> torch.Tensor:
        keys = required_inputs.get(config.name)
        if keys is None:
            raise RecMetricException(f"Required inputs for SegmentedNEMetricComputation update should contain "
                                     f"'{config.name}', got keys: {list(required_inputs)}")
        if keys.dtype != torch.int64:
            if not (config.cast_keys_to_int and keys.dtype in (torch.float32, torch.float64)):
                raise RecMetricException(f"Grouping key '{config.name}' expected to have type torch.int64 or "
                                         "torch.float32/torch.float64 with cast_keys_to_int set to true, got "
                                         f"{keys.dtype}.")
            keys = keys.to(torch.int64)
        keys = keys.reshape(-1)
        if keys.numel() != num_samples:
            raise ValueError(f"SegmentedNEMetric: grouping key {config.name!r} has {keys.numel()} values for "
                             f"{num_samples} samples; give one group per sample")
        outside = keys[(keys < 0) | (keys >= config.num_groups)]
        if outside.numel():
            raise ValueError(f"SegmentedNEMetric: grouping key {config.name!r} has value {int(outside[0])} outside "
                             f"[0, num_groups={config.num_groups}); raise num_groups or fix the keys")
        return keys

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        predictions, labels, weights = checked_batch("SegmentedNEMetricComputation", predictions, labels, weights)
        if "required_inputs" not in kwargs:
            raise RecMetricException("Required inputs for SegmentedNEMetricComputation update should be provided, "
                                     f"got kwargs: {kwargs}")
        num_samples = predictions.shape[-1]
        for config in self._grouping_key_configs:
            groups = self._group_of_each_sample(config, kwargs["required_inputs"], num_samples)
            batch_states = get_segemented_ne_states_fused(labels, predictions, weights, groups.to(predictions.device),
                                                          ETA, config.num_groups, self._n_tasks)
            for state in _STATES:
                batch_sums = batch_states[state]
                name = self._state_prefix(config) + state
                getattr(self, name).add_(batch_sums)
                self._aggregate_window_state(name, batch_sums, num_samples)

    def _compute(self) -> List[MetricComputationReport]:
        fused = self._compute_mode != RecComputeMode.UNFUSED_TASKS_COMPUTATION
        reports: List[MetricComputationReport] = []
        for config in self._grouping_key_configs:
            prefix, suffix = self._state_prefix(config), self._description_suffix(config)
            sums = {metric_prefix: [read(prefix + state) for state in _STATES] for metric_prefix, read in
                    ((MetricPrefix.LIFETIME, lambda name: getattr(self, name)),
                     (MetricPrefix.WINDOW, self.get_window_state))}
            values = {(MetricName.SEGMENTED_NE, metric_prefix): normalized_entropy(*states).float()
                      for metric_prefix, states in sums.items()}
            if self._include_logloss:
                values.update({(MetricName.LOG_LOSS, metric_prefix): ce / (pos + neg).clamp(min=ETA)
                               for metric_prefix, (ce, _, pos, neg) in sums.items()})
            for name in dict.fromkeys(name for name, _ in values):  # NE first, then logloss; each group lifetime, window
                for group in range(config.num_groups):
                    for metric_prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW):
                        value = values[name, metric_prefix]
                        reports.append(MetricComputationReport(name, metric_prefix,
                                                               value[:, group] if fused else value[0, group],
                                                               description=f"_{group}{suffix}"))
        return reports


class SegmentedNEMetric(RecMetric):
    """Lifetime and window NE per task and group (`segmented_ne-{task}|{lifetime,window}_segmented_ne_{group}`).

    Options (TorchRec's): num_groups (default 1), grouping_keys (default "grouping_keys": the model output of the
    group ids), cast_keys_to_int (float keys cast to int64), include_logloss. `get_required_inputs()` names the
    grouping keys; RecMetricModule reads them from the model output.
    """

    _namespace = "segmented_ne"
    _computation_class = SegmentedNEMetricComputation

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._computation_required_inputs.update(grouping_key_names(kwargs))

    def update(self, *, predictions: Any, labels: Any, weights: Any, **kwargs: Any) -> None:
        """As RecMetric's; each grouping key in `required_inputs` must hold one group per sample (or one for all,
        in the unfused mode), which is checked here, before the tasks' rows are cut from it."""
        required = kwargs.get("required_inputs") or {}
        if self._compute_mode == RecComputeMode.UNFUSED_TASKS_COMPUTATION and isinstance(labels, dict):
            for name in sorted(self._computation_required_inputs):
                keys = required.get(name)
                sizes = {tensor.numel() for tensor in labels.values() if tensor.numel()}
                if isinstance(keys, torch.Tensor) and keys.numel() > 1 and sizes - {keys.numel()}:
                    raise ValueError(f"SegmentedNEMetric: grouping key {name!r} has {keys.numel()} values for "
                                     f"{max(sizes)} samples; give one group per sample")
        super().update(predictions=predictions, labels=labels, weights=weights, **kwargs)


__all__ = ["GroupingKeyConfig", "SegmentedNEMetric", "SegmentedNEMetricComputation", "compute_cross_entropy",
           "compute_logloss", "compute_ne", "compute_ne_fused", "compute_ne_helper", "get_segemented_ne_states",
           "get_segemented_ne_states_fused"]
