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

from typing import Any, Dict

import torch

from rectoolkit.metrics.rec_metric import MissingRequiredInputError, SumStateMetric


def session_auc_sums(predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     num_candidates: torch.Tensor) -> torch.Tensor:
    """[sum of the counted sessions' AUC, sessions counted] (float64) of one task's batch cut into consecutive
    sessions of `num_candidates` samples (see the module docstring)."""
    sessions = num_candidates.numel()
    session_of = torch.repeat_interleave(torch.arange(sessions), num_candidates)
    starts = torch.cumsum(num_candidates, 0) - num_candidates
    position = torch.arange(predictions.numel()) - starts[session_of]
    # TorchRec's dense [session, position] layout, padded with (prediction 0, label 0, weight 0)
    dense = torch.zeros(3, sessions, int(num_candidates.max()), dtype=torch.float64)
    dense[:, session_of, position] = torch.stack([predictions, labels, weights]).double()
    scores, session_labels, session_weights = dense
    order = torch.argsort(scores, dim=-1, stable=True)
    positive = (session_weights * session_labels).gather(-1, order)
    negative = (session_weights * (1 - session_labels)).gather(-1, order)
    positives, negatives = positive.sum(-1), negative.sum(-1)
    auc = (positive * torch.cumsum(negative, -1)).sum(-1) / (positives * negatives + 1e-10)
    all_alike = ((scores == scores[:, :1]) | (scores == 0)).all(-1)
    counted = (positives > 0) & (negatives > 0) & ~all_alike
    return torch.stack([(auc * counted).sum(), counted.sum().double()])


class GAUCMetric(SumStateMetric):
    """Lifetime and window GAUC per task, with the number of sessions each counts (TorchRec's constructor;
    update() needs `num_candidates=`, see the module docstring)."""

    _namespace = "gauc"
    _state_names = ("auc_sum", "num_samples")
    _report_groups = (("gauc",), ("gauc_num_samples",))

    def _batch_inputs(self, kwargs: Dict[str, Any]) -> Dict[str, Any]:
        if kwargs.get("num_candidates") is None:
            raise MissingRequiredInputError(
                "GAUCMetric.update: num_candidates is missing; pass the sizes of the batch's sessions in order, "
                "update(..., num_candidates=torch.tensor([3, 5])) (through a RecMetricModule: "
                "module.update(model_out, num_candidates=...); TorchRec's GAUC reads no model output for it)")
        num_candidates = torch.as_tensor(kwargs["num_candidates"]).detach().cpu().reshape(-1)
        if num_candidates.is_floating_point() or num_candidates.is_complex() or (num_candidates < 0).any():
            raise ValueError(f"GAUCMetric.update: num_candidates={num_candidates.tolist()} must be session sizes, "
                             "integers >= 0; pass an integer tensor")
        return {"num_candidates": num_candidates.long()}

    def _update_task(self, task_index: int, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                     num_candidates: torch.Tensor) -> None:
        if int(num_candidates.sum()) != predictions.numel():
            raise ValueError(f"GAUCMetric.update: num_candidates ({num_candidates.numel()} sessions) sums to "
                             f"{int(num_candidates.sum())} but task {self._tasks[task_index].name!r} has "
                             f"{predictions.numel()} samples in this batch; pass the sizes of all its sessions")
        super()._update_task(task_index, predictions, labels, weights, num_candidates=num_candidates)

    def _batch_states(self, predictions: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                      num_candidates: torch.Tensor) -> torch.Tensor:
        return session_auc_sums(predictions, labels, weights, num_candidates)

    def _values(self, states: torch.Tensor) -> Dict[str, torch.Tensor]:
        auc_sum, sessions = states
        return {"gauc": (auc_sum + 1e-9) / (sessions + 2e-9), "gauc_num_samples": sessions}


__all__ = ["GAUCMetric", "session_auc_sums"]
