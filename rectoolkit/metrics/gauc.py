"""GAUC, grouped (session) AUC (`torchrec.metrics.gauc.GAUCMetric`): the AUC within each session of a batch,
averaged over the sessions where it means something.

A batch is cut into consecutive sessions by `num_candidates`, the sizes of its sessions in order (they sum to
the batch size). TorchRec's GAUC takes it as a keyword of update(), not as a model output (it declares no
required input), so rectoolkit does too:

    metric.update(predictions=..., labels=..., weights=..., num_candidates=torch.tensor([3, 5]))
    module.update(model_out, num_candidates=torch.tensor([3, 5]))     # a RecMetricModule passes it on

Within a session, samples ranked by prediction from the lowest up (ties in batch order, as TorchRec's sort),

    AUC_s = sum_i w_i y_i * (negative weight up to and including i) / (P_s N_s + 1e-10),

P_s = sum w y and N_s = sum w (1 - y) over the session. So a negative tied with a positive counts whole when it
comes first in the batch and not at all when it comes after (AUCMetric counts it 1/2). A session counts when
P_s > 0, N_s > 0 and its predictions are not all equal to its first one or 0 (TorchRec's check, which reads a
prediction of exactly 0 as padding). Then

    GAUC = (sum of the counted AUC_s + 1e-9) / (sessions counted + 2e-9),

0.5 while no session counts. The metric reports it (`gauc-{task}|lifetime_gauc`, `|window_gauc`) and the
number of sessions counted (`|lifetime_gauc_num_samples`, `|window_gauc_num_samples`), TorchRec's keys in its
order. Its states are those two sums, so the window is NE's (whole batches), and a session split by two
batches counts as two.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> gauc = GAUCMetric(world_size=1, my_rank=0, batch_size=5, tasks=[RecTaskInfo(name="t")], window_size=5)
    >>> gauc.update(predictions={"t": torch.tensor([0.2, 0.8, 0.4, 0.3, 0.9])},
    ...             labels={"t": torch.tensor([0., 1., 1., 0., 0.])}, weights=None,
    ...             num_candidates=torch.tensor([2, 3]))
    >>> {key: round(float(value), 3) for key, value in gauc.compute().items() if "lifetime" in key}
    {'gauc-t|lifetime_gauc': 0.75, 'gauc-t|lifetime_gauc_num_samples': 2.0}

(Session 1 ranks its positive above its negative: AUC 1; session 2 ranks it above one of two negatives: 1/2.)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from rectoolkit.metrics.computation import MetricComputationReport
from rectoolkit.metrics.metrics_namespace import MetricName, MetricPrefix
from rectoolkit.metrics.rec_metric import MissingRequiredInputError, SumStateMetric
from rectoolkit.metrics.sum_states import SumStatesComputation


def compute_gauc_3d(predictions: torch.Tensor, labels: torch.Tensor,
                    weights: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.gauc.compute_gauc_3d`: per task, the sum of the counted sessions' AUC (the inputs' dtype)
    and their number (int64), from [n_task, n_session, n_sample] tensors (see the module docstring)."""
    order = torch.argsort(predictions, dim=-1)
    positive = (weights * labels).gather(-1, order)
    negative = (weights * (1 - labels)).gather(-1, order)
    positives, negatives = positive.sum(-1), negative.sum(-1)
    auc = (positive * torch.cumsum(negative, -1)).sum(-1) / (positives * negatives + 1e-10)
    all_alike = ((predictions == predictions[:, :, :1]) | (predictions == 0)).all(-1)
    counted = (positives > 0) & (negatives > 0) & ~all_alike
    return {"auc_sum": (auc * counted).sum(-1), "num_samples": counted.sum(-1)}


def to_3d(tensor_2d: torch.Tensor, seq_lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """`torchrec.metrics.gauc.to_3d` (fbgemm's jagged_2d_to_dense): the [total, d] rows cut into consecutive
    sequences of `seq_lengths` rows, as [n_sequences, max_length, d], zero-padded, each cut at max_length."""
    lengths = seq_lengths.to(torch.long).reshape(-1)
    sequence_of = torch.repeat_interleave(torch.arange(lengths.numel(), device=tensor_2d.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    position = torch.arange(int(lengths.sum()), device=tensor_2d.device) - starts[sequence_of]
    kept = position < max_length
    dense = tensor_2d.new_zeros(lengths.numel(), max_length, tensor_2d.size(-1))
    dense[sequence_of[kept], position[kept]] = tensor_2d[:int(lengths.sum())][kept]
    return dense


def get_auc_states(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor,
                   num_candidates: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.gauc.get_auc_states`: compute_gauc_3d of [n_task, n_sample] inputs cut into consecutive
    sessions of num_candidates samples."""
    longest = int(num_candidates.max())
    dense = [to_3d(tensor.permute(1, 0), num_candidates, longest).permute(2, 0, 1)
             for tensor in (predictions, labels, weights)]
    return compute_gauc_3d(*dense)


def compute_window_auc(auc: torch.Tensor, num_samples: torch.Tensor) -> Dict[str, torch.Tensor]:
    """`torchrec.metrics.gauc.compute_window_auc`: {"gauc": (auc + 1e-9) / (num_samples + 2e-9) (0.5 with no
    session), "num_samples": num_samples}."""
    return {"gauc": (auc + 1e-9) / (num_samples + 2e-9), "num_samples": num_samples}


def checked_num_candidates(owner: str, num_candidates: Any, num_samples: Optional[int] = None) -> torch.Tensor:
    """num_candidates as an int64 vector, refused when missing, not integer sizes >= 0, or (num_samples given) not
    summing to the batch's samples."""
    if num_candidates is None:
        raise MissingRequiredInputError(
            f"{owner}.update: num_candidates is missing; pass the sizes of the batch's sessions in order, "
            "update(..., num_candidates=torch.tensor([3, 5])) (through a RecMetricModule: "
            "module.update(model_out, num_candidates=...); TorchRec's GAUC reads no model output for it)")
    num_candidates = torch.as_tensor(num_candidates).detach().cpu().reshape(-1)
    if num_candidates.is_floating_point() or num_candidates.is_complex() or (num_candidates < 0).any():
        raise ValueError(f"{owner}.update: num_candidates={num_candidates.tolist()} must be session sizes, "
                         "integers >= 0; pass an integer tensor")
    if num_samples is not None and int(num_candidates.sum()) != num_samples:
        raise ValueError(f"{owner}.update: num_candidates ({num_candidates.numel()} sessions) sums to "
                         f"{int(num_candidates.sum())} but the batch has {num_samples} samples; pass the sizes of "
                         "all its sessions")
    return num_candidates.long()


class GAUCMetricComputation(SumStatesComputation):
    """TorchRec's GAUC computation: states `auc_sum`, `num_samples` (float64, with windows); update() takes
    `num_candidates=` (refused by name when missing or not the batch's session sizes); reports gauc, then
    gauc_num_samples, each lifetime then window."""

    _state_names = ("auc_sum", "num_samples")
    _weights_required = True

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      **kwargs: Any) -> Dict[str, torch.Tensor]:
        num_candidates = checked_num_candidates(type(self).__name__, kwargs.get("num_candidates"),
                                                predictions.shape[-1])
        return get_auc_states(labels, predictions, weights, num_candidates.to(predictions.device))

    def _compute(self) -> List[MetricComputationReport]:
        values = {prefix: compute_window_auc(*self._states_at(prefix, self._state_names))
                  for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW)}
        return [MetricComputationReport(name, prefix, values[prefix][value])
                for name, value in ((MetricName.GAUC, "gauc"), (MetricName.GAUC_NUM_SAMPLES, "num_samples"))
                for prefix in values]


class GAUCMetric(SumStateMetric):
    """Lifetime and window GAUC per task, with the number of sessions each counts (TorchRec's constructor;
    update() needs `num_candidates=`, see the module docstring)."""

    _namespace = "gauc"
    _state_names = GAUCMetricComputation._state_names
    _report_groups = (("gauc",), ("gauc_num_samples",))

    def _batch_inputs(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        return {"num_candidates": checked_num_candidates("GAUCMetric", kwargs.get("num_candidates"))}

    def _update_task(self, task_index: int, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     num_candidates: torch.Tensor) -> None:
        if int(num_candidates.sum()) != predictions.numel():
            raise ValueError(f"GAUCMetric.update: num_candidates ({num_candidates.numel()} sessions) sums to "
                             f"{int(num_candidates.sum())} but task {self._tasks[task_index].name!r} has "
                             f"{predictions.numel()} samples in this batch; pass the sizes of all its sessions")
        super()._update_task(task_index, predictions, labels, weights, num_candidates=num_candidates)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      num_candidates: torch.Tensor) -> Dict[str, torch.Tensor]:
        return get_auc_states(*(tensor.view(1, -1) for tensor in (labels, predictions, weights)), num_candidates)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        values = compute_window_auc(*states)
        return {"gauc": values["gauc"], "gauc_num_samples": values["num_samples"]}


__all__ = ["GAUCMetric", "GAUCMetricComputation", "checked_num_candidates", "compute_gauc_3d", "compute_window_auc",
           "get_auc_states", "to_3d"]
