"""Reading a model's output dict into the metrics' inputs, at TorchRec's path (`torchrec.metrics.model_utils`).

A model returns one dict of tensors; each RecTaskInfo names the keys of its labels, predictions and weights, and
some metrics read more keys (their required inputs, e.g. NDCG's session ids). `parse_task_model_outputs` splits the
dict into {task: tensor} dicts for RecMetric.update, as TorchRec's:

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> model_out = {"label": torch.tensor([[1.0], [0.0]]), "prediction": torch.tensor([[0.7], [0.2]]),
    ...              "weight": torch.ones(2, 1), "session": ["a", "a"]}
    >>> labels, predictions, weights, required = parse_task_model_outputs(
    ...     [RecTaskInfo(name="ndcg_click")], model_out, required_inputs_list=["session"])
    >>> labels["ndcg_click"].tolist(), required["session"].tolist()
    ([1.0, 0.0], [1, 1])

Inputs TorchRec rejects with an `assert` are refused here with a `ModelOutputError`, which names the keys and sizes
and is an AssertionError too, so TorchRec's `except` clauses still catch it.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from rectoolkit.metrics.metrics_config import RecTaskInfo
from rectoolkit.metrics.rec_metric import MissingRequiredInputError

logger = logging.getLogger(__name__)


class ModelOutputError(ValueError, AssertionError):
    """A model output that does not fit the metrics (TorchRec asserts where this is raised)."""


def session_ids_to_tensor(session_ids: Sequence[Any], device: Optional[torch.device] = None) -> torch.Tensor:
    """Session ids from a list (of strings, say) as TorchRec's: 1, 2, ... numbering the runs of equal consecutive
    ids (an empty list gives an empty tensor; TorchRec's gives [1]).

        >>> session_ids_to_tensor(["a", "a", "b", "a"]).tolist()
        [1, 1, 2, 3]
    """
    numbers: List[int] = []
    for index, session in enumerate(session_ids):
        numbers.append(1 if index == 0 else numbers[-1] + (session != session_ids[index - 1]))
    return torch.tensor(numbers, dtype=torch.int64, device=device)


def is_empty_signals(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> bool:
    """True when labels, predictions and weights are all empty (a task with no sample in this batch)."""
    return labels.numel() <= 0 and predictions.numel() <= 0 and weights.numel() <= 0


def _lookup(model_out: Dict[str, Any], key: str, what: str) -> Any:
    if key not in model_out:
        raise ValueError(f"{what} {key} not found in model output (it has {sorted(model_out)}); set the RecTaskInfo's "
                         f"name to one of these keys")
    return model_out[key]


def _check_sizes(labels: torch.Tensor, predictions: torch.Tensor, weights: torch.Tensor) -> None:
    """TorchRec's layouts: one label, prediction and weight per sample; [batch, d] labels and predictions with
    [batch] weights (vector-valued, logged); or [batch] labels with [batch, classes] predictions (multiclass)."""
    sizes = f"labels {tuple(labels.shape)}, predictions {tuple(predictions.shape)}, weights {tuple(weights.shape)}"
    if labels.dim() != predictions.dim():  # multiclass
        if labels.numel() * predictions.size(-1) != predictions.numel() or labels.numel() != weights.numel():
            raise ModelOutputError(f"parse_model_outputs: {sizes} do not fit a multiclass task: give one label and "
                                   "weight per sample and one row of class scores per sample")
        return
    vector_valued = (labels.dim() == 2 and weights.dim() == 1 and labels.size(0) == predictions.size(0)
                     == weights.size(0))
    if vector_valued:
        logger.warning("parse_model_outputs: vector-valued labels and predictions (%s): one weight per row", sizes)
    elif not labels.numel() == predictions.numel() == weights.numel():
        raise ModelOutputError(f"Expect the same number of elements in labels, predictions, and weights. Instead got "
                               f"{labels.numel()}, {predictions.numel()}, {weights.numel()} ({sizes})")


def parse_model_outputs(label_name: str, prediction_name: str, weight_name: str, model_out: Dict[str, torch.Tensor]
                        ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """One task's (labels, predictions, weights) from the model output, squeezed (a single sample as [1]); with
    no prediction_name (a label-only task) (labels, None, None). A missing key is a ValueError naming it."""
    labels = _lookup(model_out, label_name, "Label name").squeeze()
    if not prediction_name:
        if weight_name:
            raise ModelOutputError(f"parse_model_outputs: weight_name={weight_name!r} without a prediction_name; "
                                   "a label-only task has neither (set weight_name='')")
        return labels, None, None
    predictions = _lookup(model_out, prediction_name, "Prediction name").squeeze()
    weights = _lookup(model_out, weight_name, "Weight").squeeze()
    for name, value in ((label_name, labels), (prediction_name, predictions), (weight_name, weights)):
        if not isinstance(value, torch.Tensor):
            raise ModelOutputError(f"parse_model_outputs: model_out[{name!r}] is a {type(value).__name__}; "
                                   "pass a tensor")
    if not is_empty_signals(labels, predictions, weights):
        _check_sizes(labels, predictions, weights)
        if labels.dim() == 0:
            labels, predictions, weights = labels.unsqueeze(0), predictions.unsqueeze(0), weights.unsqueeze(0)
    return labels, predictions, weights


def parse_required_inputs(model_out: Dict[str, torch.Tensor], required_inputs_list: List[str],
                          ndcg_transform_input: bool = False,
                          device: Optional[torch.device] = None) -> Dict[str, torch.Tensor]:
    """{name: model_out[name] squeezed} for the required inputs; with ndcg_transform_input a list of session ids
    becomes session numbers (session_ids_to_tensor), written back into model_out as TorchRec's."""
    required: Dict[str, torch.Tensor] = {}
    for name in required_inputs_list:
        if name not in model_out:
            raise MissingRequiredInputError(f"parse_required_inputs: the metrics read {name!r} from the model output "
                                            f"but it has only {sorted(model_out)}; add {name!r} to the model output")
        if ndcg_transform_input and isinstance(model_out[name], list):
            model_out[name] = session_ids_to_tensor(model_out[name], device=device)
        if not isinstance(model_out[name], torch.Tensor):
            raise ModelOutputError(f"parse_required_inputs: model_out[{name!r}] is a {type(model_out[name]).__name__};"
                                   " pass a tensor (or, for an NDCG task, a list of session ids)")
        required[name] = model_out[name].squeeze()
    return required


def parse_task_model_outputs(tasks: List[RecTaskInfo], model_out: Dict[str, torch.Tensor],
                             required_inputs_list: Optional[List[str]] = None
                             ) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor], Dict[str, torch.Tensor],
                                        Dict[str, torch.Tensor]]:
    """({task: labels}, {task: predictions}, {task: weights}, {name: required input}) from the model output; a
    task with no sample in this batch is left out, a label-only task has labels only. As TorchRec's, session ids
    given as a list are numbered only when a task's name starts with "ndcg", on the last task's labels' device."""
    labels_of: Dict[str, torch.Tensor] = {}
    predictions_of: Dict[str, torch.Tensor] = {}
    weights_of: Dict[str, torch.Tensor] = {}
    device: Optional[torch.device] = None
    for task in tasks:
        labels, predictions, weights = parse_model_outputs(task.label_name, task.prediction_name, task.weight_name,
                                                           model_out)
        device = labels.device
        if predictions is None or weights is None:
            if labels.numel() > 0:
                labels_of[task.name] = labels
        elif not is_empty_signals(labels, predictions, weights):
            labels_of[task.name], predictions_of[task.name], weights_of[task.name] = labels, predictions, weights
    required: Dict[str, torch.Tensor] = {}
    if required_inputs_list is not None:
        ndcg_transform_input = any(task.name and task.name.startswith("ndcg") for task in tasks)
        required = parse_required_inputs(model_out, required_inputs_list, ndcg_transform_input, device=device)
    return labels_of, predictions_of, weights_of, required


__all__ = ["ModelOutputError", "is_empty_signals", "parse_model_outputs", "parse_required_inputs",
           "parse_task_model_outputs", "session_ids_to_tensor"]
