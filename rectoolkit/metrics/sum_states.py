"""The computations of the metrics that are sums of each batch (TorchRec's counting and averaging metrics: number
of positive samples, of missing labels, sum of weights, weighted sum of predictions, label / prediction average,
XAUC, multiclass recall, hindsight target PR).

Each state is a per-task float64 sum (`[n_tasks, *shape]`), kept for the lifetime and, beside it, for the window
(`window_<state>`, the last batches of `window_size` samples), reduced over the ranks by all_reduce(SUM) and saved
in the state_dict as TorchRec's (`_metrics_computations.{i}.<state>`). A subclass names its states and says what a
batch adds to each; a metric of one sum (`SingleSumComputation`) names the sum and its report too.

    >>> from rectoolkit.metrics.metrics_namespace import MetricName
    >>> class LabelSum(SingleSumComputation):
    ...     _state_name, _metric_name = "label_sum", MetricName.CTR
    ...     def _batch_sum(self, predictions, labels, weights):
    ...         return torch.sum(labels * weights, dim=-1)
    >>> computation = LabelSum(my_rank=0, batch_size=2, n_tasks=1, window_size=2)
    >>> for labels in ([1.0, 1.0], [0.0, 1.0]):
    ...     computation.update(predictions=torch.zeros(1, 2), labels=torch.tensor([labels]), weights=torch.ones(1, 2))
    >>> [(str(r.metric_prefix), r.value.tolist()) for r in computation.compute()]
    [('lifetime_', [3.0]), ('window_', [1.0])]
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_namespace import MetricNameBase, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetricException, ratio_or_zero


class SumStatesComputation(RecMetricComputation):
    """Per-task sums (`_state_names`, each of trailing shape `_state_shape(name)`), lifetime and window, summed
    over the ranks; `_batch_states` says what one batch adds to each."""

    _state_names: Tuple[str, ...] = ()
    # TorchRec's NE, CTR, MSE, ... refuse weights=None in update(); the counting metrics take all ones
    _weights_required: bool = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in self._state_names:
            self._add_state(name, torch.zeros(self._n_tasks, *self._state_shape(name), dtype=torch.double),
                            add_window_state=True, dist_reduce_fx="sum", persistent=self._is_persistent(name))

    def _is_persistent(self, name: str) -> bool:
        """Whether state `name` goes into the state_dict (all do by default)."""
        return True

    def _state_shape(self, name: str) -> Tuple[int, ...]:
        """The shape of one task's value of state `name` (a scalar by default)."""
        return ()

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        """{state: what this batch adds} from [n_tasks, batch] inputs (`kwargs`: update's other keywords)."""
        raise NotImplementedError

    def _num_samples(self, predictions: torch.Tensor, labels: torch.Tensor) -> int:
        """The samples a batch counts for in the window (TorchRec's: the last dimension of the predictions)."""
        return predictions.shape[-1]

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        if predictions is None:
            raise RecMetricException(f"{type(self).__name__}.update: predictions is None; pass the model's "
                                     "predictions (a tensor of the labels' shape)")
        if weights is None and self._weights_required:
            raise RecMetricException(f"{type(self).__name__}.update: weights is None; pass a tensor of the labels' "
                                     "shape (torch.ones_like(labels) for unweighted samples)")
        if weights is None:
            weights = torch.ones_like(labels)
        num_samples = self._num_samples(predictions, labels)
        for name, batch_value in self._batch_states(predictions, labels, weights, **kwargs).items():
            state = getattr(self, name)
            state += batch_value
            self._aggregate_window_state(name, batch_value, num_samples)

    def _lifetime_and_window(self, name: str) -> List[Tuple[MetricPrefix, torch.Tensor]]:
        """(prefix, value) of state `name`: the lifetime sum, then the window's."""
        return [(MetricPrefix.LIFETIME, getattr(self, name)), (MetricPrefix.WINDOW, self.get_window_state(name))]

    def _states_at(self, prefix: MetricPrefix, names: Tuple[str, ...]) -> List[torch.Tensor]:
        """The lifetime (or window) values of the states `names`, in that order."""
        return [getattr(self, name) if prefix == MetricPrefix.LIFETIME else self.get_window_state(name)
                for name in names]

    def _lifetime_and_window_reports(self, name: MetricNameBase, compute: Callable[..., torch.Tensor],
                                     state_names: Tuple[str, ...], *args: Any) -> List[MetricComputationReport]:
        """Two reports of `name`: compute(*lifetime states, *args), then compute(*window states, *args)."""
        return [MetricComputationReport(name, prefix, compute(*self._states_at(prefix, state_names), *args))
                for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW)]


def safe_ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """numerator / denominator in float64, 0 where the denominator is 0 (TorchRec's averages and XAUC)."""
    return ratio_or_zero(numerator, denominator)


class OneValueComputation(SumStatesComputation):
    """One value per task, `_metric_name`, lifetime then window: `_compute_value(*states)` over the sums of
    `_state_names`, which a batch adds `_get_states(labels, predictions, weights)` to (a metric's TorchRec functions,
    e.g. compute_ctr and get_ctr_states)."""

    _metric_name: Optional[MetricNameBase] = None

    @staticmethod
    def _get_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> Dict[str, torch.Tensor]:
        raise NotImplementedError

    @staticmethod
    def _compute_value(*states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return self._get_states(labels, predictions, weights)

    def _compute(self) -> List[MetricComputationReport]:
        return self._lifetime_and_window_reports(self._metric_name, self._compute_value, self._state_names)


def single_sum_states(state_name: str, compute: Callable[..., torch.Tensor], labels: torch.Tensor,
                      predictions: torch.Tensor, weights: Optional[torch.Tensor]) -> Dict[str, torch.Tensor]:
    """{state_name: compute(labels, predictions, weights)}, weights None read as all ones (the get_*_states of
    TorchRec's counting metrics)."""
    return {state_name: compute(labels, predictions, torch.ones_like(labels) if weights is None else weights)}


class SingleSumComputation(SumStatesComputation):
    """One per-task sum (`_state_name`), reported as itself under `_metric_name`, lifetime then window."""

    _state_name: str = ""
    _metric_name: Optional[MetricNameBase] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._state_names = (self._state_name,)
        super().__init__(*args, **kwargs)

    def _batch_sum(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """This batch's [n_tasks] sum."""
        raise NotImplementedError

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        return {self._state_name: self._batch_sum(predictions, labels, weights)}

    def _compute(self) -> List[MetricComputationReport]:
        return [MetricComputationReport(self._metric_name, prefix, value)
                for prefix, value in self._lifetime_and_window(self._state_name)]


__all__ = ["OneValueComputation", "SingleSumComputation", "SumStatesComputation", "safe_ratio", "single_sum_states"]
