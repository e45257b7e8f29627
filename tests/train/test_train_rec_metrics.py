"""The recipe's RecMetricModule: NE, calibration and window AUC in every report, one value for all ranks, and
NE consistent with the reported loss (NE = mean cross-entropy / entropy of the label rate)."""

import math

import pytest
import torch

from rectoolkit.launch import WorkerContext, start
from rectoolkit.train import SyntheticData, TrainConfig, make_tables, train

TINY = dict(workload="dlrm26", max_rows=200, embedding_dim=8, batch_size=32)
KEYS = {"window_ne", "lifetime_ne", "window_calibration", "lifetime_calibration", "window_auc"}


def label_entropy_nats(config, steps, world_size):
    """Entropy of always predicting the label rate of steps [0, steps) of every rank, from the data itself."""
    tables, pooling, dense_features, alpha = make_tables(config)
    data = SyntheticData(tables, pooling, config.batch_size, dense_features=dense_features, zipf_alpha=alpha,
                         seed=config.seed, world_size=world_size)
    rate = torch.cat([data.global_batch(step).labels for step in range(steps)]).double().mean().item()
    return -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))


def check_reports(reports, config, world_size):
    for report in reports:
        assert KEYS <= set(report), sorted(report)
    # every step's loss is the mean over the same number of samples: the lifetime mean loss is the mean of the
    # reported means weighted by the steps each covers
    steps, total = 0, 0.0
    for report in reports:
        total += report["loss"] * (report["step"] - steps)
        steps = report["step"]
        expected_ne = (total / steps) / label_entropy_nats(config, steps, world_size)
        assert report["lifetime_ne"] == pytest.approx(expected_ne, rel=1e-4), report["step"]
        # the same window of the same predictions as the recipe's own AUC (its last auc_window_steps steps)
        assert report["window_auc"] == pytest.approx(report["auc"], abs=1e-6)
        assert 0 < report["window_calibration"] < 5 and 0 < report["lifetime_calibration"] < 5


@pytest.mark.timeout(120)
def test_single_process_reports_ne_and_calibration():
    torch.set_num_threads(1)
    config = TrainConfig(steps=30, report_every=10, auc_window_steps=5, **TINY)
    ctx = WorkerContext.single_process()
    train(ctx, config)
    assert [r["step"] for r in ctx.history] == [10, 20, 30]
    check_reports(ctx.history, config, 1)
    assert ctx.history[-1]["window_ne"] < 1.0  # the model beats the label rate on its last 5 steps


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_workers_report_the_same_global_metrics():
    config = TrainConfig(steps=6, report_every=3, auc_window_steps=2, **TINY)
    job = start(train, 2, config, num_threads=1, echo_output=False, timeout_s=150)
    job.wait(timeout=150)
    reports = {rank: [m for m in job.history if m.get("rank") == rank and "step" in m] for rank in (0, 1)}
    assert [m["step"] for m in reports[0]] == [3, 6] == [m["step"] for m in reports[1]]
    for first, second in zip(reports[0], reports[1]):
        assert {k: first[k] for k in KEYS} == {k: second[k] for k in KEYS}
    check_reports(reports[0], config, 2)
