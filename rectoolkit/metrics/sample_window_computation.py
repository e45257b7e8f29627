"""The computation of the metrics that keep the window's samples themselves (TorchRec's AUCMetricComputation and
RAUCMetricComputation): no sums, but the last `window_size` (prediction, label, weight) samples of this rank.

TorchRec's states, which a RecMetric subclass or a user's `_compute` may read: `predictions`, `labels`, `weights`,
each a list of [n_tasks, n] float32 tensors, oldest first. Before any update each holds one [n_tasks, 1] zero
sample (so that torchmetrics can gather them); the first update drops it. When the window overflows, the oldest
tensor is dropped whole or cut at the front, as TorchRec's. Across ranks the lists are concatenated and gathered
(`dist_reduce_fx`: concatenation along the samples).

    >>> from rectoolkit.metrics.auc import AUCMetricComputation
    >>> computation = AUCMetricComputation(my_rank=0, batch_size=2, n_tasks=1, window_size=3)
    >>> for scores in ([0.25, 0.75], [0.5, 0.125]):
    ...     computation.update(predictions=torch.tensor([scores]), labels=torch.tensor([[0.0, 1.0]]),
    ...                        weights=torch.ones(1, 2))
    >>> [tensor.tolist() for tensor in computation.predictions]   # the last 3 samples
    [[[0.75]], [[0.5, 0.125]]]
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from rectoolkit.metrics.computation import RecMetricComputation
from rectoolkit.metrics.rec_metric import RecMetricException

SAMPLE_STATES = ("predictions", "labels", "weights")


def concatenate_samples(state: List[torch.Tensor]) -> List[torch.Tensor]:
    """TorchRec's reduction of a sample list over the ranks: one tensor, the ranks' samples side by side."""
    return [torch.cat(state, dim=1)]


class SampleWindowComputation(RecMetricComputation):
    """The window's samples, per task, as TorchRec's lists (see the module docstring); a subclass writes
    `_compute` over `self.predictions`, `self.labels`, `self.weights`. `grouped` names TorchRec's grouped variant
    (grouped_auc, grouped_rauc), which is not implemented here and refused when True."""

    _grouped_option = ""

    def __init__(self, *args: Any, fused_update_limit: int = 0, **kwargs: Any) -> None:
        grouped = kwargs.pop(self._grouped_option, False) if self._grouped_option else False
        super().__init__(*args, **kwargs)
        if grouped:
            raise NotImplementedError(f"{type(self).__name__}: {self._grouped_option}=True (a value per group of "
                                      "`grouping_keys`) is not implemented in rectoolkit; pass False")
        if fused_update_limit > 1:
            raise NotImplementedError(f"{type(self).__name__}: fused_update_limit={fused_update_limit} is not "
                                      "implemented (updates are applied at once); pass 0")
        self._num_samples = 0
        for name in SAMPLE_STATES:
            self._add_state(name, [], add_window_state=False, dist_reduce_fx=concatenate_samples, persistent=False)
        self._init_states()

    def _init_states(self) -> None:
        """TorchRec's placeholder: one zero sample per task until the first update."""
        if len(self.predictions) > 0:
            return
        self._num_samples = 0
        for name in SAMPLE_STATES:
            getattr(self, name).append(torch.zeros(self._n_tasks, 1, dtype=torch.float))

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        if predictions is None or weights is None:
            raise RecMetricException(f"{type(self).__name__}.update: predictions and weights must be tensors of the "
                                     "labels' shape, got None; pass weights=torch.ones_like(labels) for unweighted "
                                     "samples")
        batch = [predictions.float(), labels.float(), weights.float()]
        lists = [getattr(self, name) for name in SAMPLE_STATES]
        if self._num_samples == 0:  # the placeholder goes
            for samples in lists:
                samples.pop(0)
        for samples, tensor in zip(lists, batch):
            samples.append(tensor)
        self._num_samples += batch[0].size(-1)
        while self._num_samples > self._window_size:
            excess = self._num_samples - self._window_size
            oldest = lists[0][0].size(-1)
            if excess > oldest:  # TorchRec drops the oldest tensor only when it is shorter than the excess
                for samples in lists:
                    samples.pop(0)
                self._num_samples -= oldest
            else:
                for samples in lists:
                    samples[0] = samples[0][:, excess:]
                    if samples[0].numel() == 0:
                        samples.pop(0)
                self._num_samples -= excess

    def sync(self) -> None:
        # as TorchRec's: each list concatenated before it is gathered; unsync() gives back the lists as they were
        originals = {name: getattr(self, name) for name in SAMPLE_STATES}
        for name, samples in originals.items():
            if len(samples) > 1:
                setattr(self, name, [torch.cat(samples, dim=-1)])
        super().sync()
        self._local_copies.update(originals)

    def reset(self) -> None:
        super().reset()
        self._init_states()


__all__ = ["SAMPLE_STATES", "SampleWindowComputation", "concatenate_samples"]
