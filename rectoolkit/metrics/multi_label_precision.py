"""Per-label precision of a multi-label task (`torchrec.metrics.multi_label_precision.MultiLabelPrecisionMetric`).

Predictions and labels are integers, each a bit set of `num_labels` labels, least significant bit first (5 = 0b101:
labels 0 and 2). For each label: TP = sum w over samples with the label's bit set in both, FP = sum w over samples
predicted with it but not labelled; precision TP / (TP + FP) (0 while nothing is predicted), lifetime and window,
under `multi_label_precision-{task}|{lifetime,window}_multi_label_precision{label name}`.

As TorchRec's, the states are single sums ([1]) per label: in the fused modes every task's samples are pooled and
only the first task gets keys.

    >>> from rectoolkit.metrics.metrics_config import RecTaskInfo
    >>> metric = MultiLabelPrecisionMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")],
    ...                                    num_labels=2, label_names=["cat", "dog"])
    >>> metric.update(predictions={"t": torch.tensor([3.0, 1.0, 2.0])}, labels={"t": torch.tensor([1.0, 1.0, 3.0])},
    ...               weights=None)
    >>> {key.split("|")[1]: value.tolist() for key, value in metric.compute().items() if "lifetime" in key}
    {'lifetime_multi_label_precisioncat': [1.0], 'lifetime_multi_label_precisiondog': [0.5]}
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from rectoolkit.metrics.computation import MetricComputationReport, RecMetricComputation
from rectoolkit.metrics.metrics_namespace import MetricName, MetricNamespace, MetricPrefix
from rectoolkit.metrics.rec_metric import RecMetric


def compute_multi_label_precision(num_true_positives: torch.Tensor,
                                  num_false_positives: torch.Tensor) -> torch.Tensor:
    """`torchrec.metrics.multi_label_precision.compute_multi_label_precision`: TP / (TP + FP), 0 where nothing is
    predicted (in the inputs' dtype)."""
    predicted = num_true_positives + num_false_positives
    return torch.where(predicted == 0.0, torch.zeros_like(predicted), num_true_positives / predicted)


def decode_label_bits(encoded: torch.Tensor, num_labels: int) -> torch.Tensor:
    """[n] integers (any dtype) -> [n, num_labels] 0/1 int32, bit i (least significant first) in column i.

        >>> decode_label_bits(torch.tensor([5, 2]), 3).tolist()
        [[1, 0, 1], [0, 1, 0]]
    """
    powers_of_two = (2 ** torch.arange(num_labels, device=encoded.device)).to(encoded.dtype)
    return ((encoded.reshape(-1, 1) // powers_of_two) % 2).to(torch.int32)


class MultiLabelPrecisionMetricComputation(RecMetricComputation):
    """TorchRec's states `true_pos_sum_{label}` and `false_pos_sum_{label}` ([1] float64, with window states)."""

    def __init__(self, *args: Any, num_labels: int = 1, label_names: Optional[List[str]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
            raise ValueError(f"MultiLabelPrecisionMetric: num_labels={num_labels!r} must be a positive int (the bits "
                             "of each encoded prediction and label)")
        if label_names is not None and len(label_names) != num_labels:
            raise ValueError(f"MultiLabelPrecisionMetric: {len(label_names)} label_names {list(label_names)} for "
                             f"num_labels={num_labels}; give one name per label")
        self._num_labels = num_labels
        self._label_names = [f"label_{i}" for i in range(num_labels)] if label_names is None else list(label_names)
        for label_name in self._label_names:
            for kind in ("true_pos_sum", "false_pos_sum"):
                self._add_state(f"{kind}_{label_name}", torch.zeros(1, dtype=torch.double), add_window_state=True,
                                dist_reduce_fx="sum", persistent=True)

    def update(self, *, predictions: Optional[torch.Tensor], labels: torch.Tensor, weights: Optional[torch.Tensor],
               **kwargs: Any) -> None:
        predicted = decode_label_bits(predictions.flatten(), self._num_labels)
        labelled = decode_label_bits(labels.flatten(), self._num_labels)
        if weights is None:
            weights = torch.ones_like(predicted, dtype=torch.float32)
        else:
            weights = weights.flatten().unsqueeze(-1).expand(-1, self._num_labels)
        num_samples = predicted.shape[0]
        true_pos = torch.sum(weights * (predicted * labelled), dim=0)
        false_pos = torch.sum(weights * (predicted * (1 - labelled)), dim=0)
        for index, label_name in enumerate(self._label_names):
            for kind, batch_sums in (("true_pos_sum", true_pos), ("false_pos_sum", false_pos)):
                getattr(self, f"{kind}_{label_name}").add_(batch_sums[index])
                self._aggregate_window_state(f"{kind}_{label_name}", batch_sums[index], num_samples)

    def _compute(self) -> List[MetricComputationReport]:
        reports = []
        for label_name in self._label_names:
            for prefix in (MetricPrefix.LIFETIME, MetricPrefix.WINDOW):
                states = [getattr(self, f"{kind}_{label_name}") if prefix == MetricPrefix.LIFETIME
                          else self.get_window_state(f"{kind}_{label_name}") for kind in ("true_pos_sum", "false_pos_sum")]
                reports.append(MetricComputationReport(MetricName.MULTI_LABEL_PRECISION, prefix,
                                                       compute_multi_label_precision(*states), label_name))
        return reports


class MultiLabelPrecisionMetric(RecMetric):
    """Per-label precision (TorchRec's constructor, with `num_labels`, default 1, and `label_names`, default
    label_0, label_1, ...)."""

    _namespace = MetricNamespace.MULTI_LABEL_PRECISION
    _computation_class = MultiLabelPrecisionMetricComputation


__all__ = ["compute_multi_label_precision", "MultiLabelPrecisionMetric", "MultiLabelPrecisionMetricComputation", "decode_label_bits"]
