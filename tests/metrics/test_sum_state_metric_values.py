"""The sum-state metrics' values where they differ on purpose from their TorchRec computation functions: the NE
family's allow_missing_label_with_zero_weight acts task by task, in float64 (TorchRec's functions give one float32
[eta] for every task once one has no weight), and NMSE reports 0 for an empty task or a zero baseline. Expected
values are worked by hand or by a reference loop."""

import math

import pytest
import torch

from rectoolkit.metrics import RecComputeMode, RecTaskInfo
from rectoolkit.metrics.cali_free_ne import CaliFreeNEMetric
from rectoolkit.metrics.ne import NEMetric
from rectoolkit.metrics.ne_positive import NEPositiveMetric
from rectoolkit.metrics.nmse import NMSEMetric
from rectoolkit.metrics.unweighted_ne import UnweightedNEMetric

TASKS = [RecTaskInfo(name="seen"), RecTaskInfo(name="unseen")]
PREDICTIONS = [0.9, 0.2, 0.6, 0.4]
LABELS = [1.0, 0.0, 0.0, 1.0]


def reference_ne(predictions, labels, positive_only=False):
    """NE with unit weights, by a loop: the cross-entropy in bits (of the positives only, for NE positive) over
    that of predicting the mean label."""
    cross_entropy = sum(-(y * math.log2(p) + (0.0 if positive_only else (1 - y) * math.log2(1 - p)))
                        for p, y in zip(predictions, labels))
    ctr = sum(labels) / len(labels)
    positives, negatives = sum(labels), len(labels) - sum(labels)
    return cross_entropy / (-positives * math.log2(ctr) - negatives * math.log2(1 - ctr))


@pytest.mark.parametrize("mode", [RecComputeMode.UNFUSED_TASKS_COMPUTATION, RecComputeMode.FUSED_TASKS_COMPUTATION])
@pytest.mark.parametrize("cls, name, unweighted, positive_only", [
    (NEMetric, "ne", False, False), (NEPositiveMetric, "ne_positive", False, True),
    (UnweightedNEMetric, "unweighted_ne", True, False)])
def test_allow_missing_label_with_zero_weight_acts_task_by_task_in_float64(cls, name, unweighted, positive_only,
                                                                           mode):
    metric = cls(world_size=1, my_rank=0, batch_size=4, tasks=TASKS, compute_mode=mode,
                 allow_missing_label_with_zero_weight=True)
    # the unweighted NE ignores the weights: its "unseen" task gets no sample at all
    predictions = {"seen": torch.tensor(PREDICTIONS, dtype=torch.float64)}
    if not unweighted:
        predictions["unseen"] = torch.tensor(PREDICTIONS, dtype=torch.float64)
    metric.update(predictions=predictions, labels={t.name: torch.tensor(LABELS) for t in TASKS},
                  weights={"seen": torch.ones(4), "unseen": torch.zeros(4)})
    values = metric.compute()
    for prefix in ("lifetime", "window"):
        seen, unseen = values[f"{name}-seen|{prefix}_{name}"], values[f"{name}-unseen|{prefix}_{name}"]
        assert seen.dtype == unseen.dtype == torch.float64
        assert float(seen) == pytest.approx(reference_ne(PREDICTIONS, LABELS, positive_only), rel=1e-12)
        assert float(unseen) == 1e-12


def test_cali_free_ne_allow_missing_label_with_zero_weight_acts_task_by_task():
    metric = CaliFreeNEMetric(world_size=1, my_rank=0, batch_size=4, tasks=TASKS,
                              compute_mode=RecComputeMode.FUSED_TASKS_COMPUTATION,
                              allow_missing_label_with_zero_weight=True)
    metric.update(predictions={t.name: torch.tensor(PREDICTIONS, dtype=torch.float64) for t in TASKS},
                  labels={t.name: torch.tensor(LABELS) for t in TASKS},
                  weights={"seen": torch.ones(4), "unseen": torch.zeros(4)})
    values = metric.compute()
    mean_prediction = sum(PREDICTIONS) / 4
    mean_prediction_bits = -(2 * math.log2(mean_prediction) + 2 * math.log2(1 - mean_prediction))
    assert float(values["cali_free_ne-seen|lifetime_cali_free_ne"]) == pytest.approx(
        reference_ne(PREDICTIONS, LABELS) / mean_prediction_bits, rel=1e-12)
    assert values["cali_free_ne-unseen|lifetime_cali_free_ne"].dtype == torch.float64
    assert float(values["cali_free_ne-unseen|lifetime_cali_free_ne"]) == 1e-12


def test_nmse_is_zero_for_an_empty_task_and_for_a_zero_baseline():
    metric = NMSEMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="empty"),
                                                                       RecTaskInfo(name="ones"),
                                                                       RecTaskInfo(name="fit")])
    metric.update(predictions={"empty": torch.tensor([0.5, 0.5]), "ones": torch.tensor([0.5, 2.0]),
                               "fit": torch.tensor([1.0, 2.0])},
                  labels={"empty": torch.tensor([1.0, 3.0]), "ones": torch.ones(2), "fit": torch.tensor([2.0, 3.0])},
                  weights={"empty": torch.zeros(2), "ones": torch.ones(2), "fit": torch.ones(2)})
    values = {key: float(value) for key, value in metric.compute().items() if "lifetime" in key}
    assert values["nmse-empty|lifetime_nmse"] == values["nmse-empty|lifetime_nrmse"] == 0.0
    assert values["nmse-ones|lifetime_nmse"] == values["nmse-ones|lifetime_nrmse"] == 0.0  # labels all 1
    # model error (1 + 1) / 2 over the baseline's (1 + 4) / 2
    assert values["nmse-fit|lifetime_nmse"] == pytest.approx(0.4, rel=1e-12)
    assert values["nmse-fit|lifetime_nrmse"] == pytest.approx(math.sqrt(0.4), rel=1e-12)
