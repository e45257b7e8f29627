"""MAE, accuracy, precision, recall, weighted-average and NE-positive metrics against TorchRec 1.8's classes on the same
batches (keys, values, state_dict), against hand-worked numbers, and across 2 gloo ranks (with GAUC and NDCG)."""

import importlib
import math

import pytest
import torch

from rectoolkit.metrics import (AccuracyMetric, MAEMetric, NEPositiveMetric, PrecisionMetric, RecallMetric,
                                RecTaskInfo, WeightedAvgMetric)
from tests.metrics.test_rec_metrics import batches as random_batches

TASKS = ["click", "like"]
BATCH = 8
OURS = {"MAEMetric": MAEMetric, "AccuracyMetric": AccuracyMetric, "PrecisionMetric": PrecisionMetric,
        "RecallMetric": RecallMetric, "WeightedAvgMetric": WeightedAvgMetric, "NEPositiveMetric": NEPositiveMetric}
MODULES = {"MAEMetric": "mae", "AccuracyMetric": "accuracy", "PrecisionMetric": "precision",
           "RecallMetric": "recall", "WeightedAvgMetric": "weighted_avg", "NEPositiveMetric": "ne_positive"}
# (class, extra arguments): each thresholded metric at its default and at a threshold the tied stream hits exactly
CASES = [("MAEMetric", {}), ("WeightedAvgMetric", {}), ("NEPositiveMetric", {})] + [
    (name, extra) for name in ("AccuracyMetric", "PrecisionMetric", "RecallMetric")
    for extra in ({}, {"threshold": 0.25})]


def batches(count=7, seed=0, tasks=TASKS, ties=False):
    """test_rec_metrics' stream (predictions in (0, 1), 0/1 labels, weights in [0.5, 2]); with ties, predictions
    are multiples of 1/4 (some exactly at the thresholds) and labels 0, 1/2 or 1."""
    stream = random_batches(count=count, seed=seed, tasks=tasks, batch=BATCH)
    if not ties:
        return stream
    generator = torch.Generator().manual_seed(seed)
    return [({t: torch.randint(0, 5, (BATCH,), generator=generator) / 4.0 for t in tasks},
             {t: torch.randint(0, 3, (BATCH,), generator=generator) / 2.0 for t in tasks}, weights)
            for _, _, weights in stream]


def feed(metric, stream):
    for predictions, labels, weights in stream:
        metric.update(predictions=predictions, labels=labels, weights=weights)
    return metric.compute()


def make(library, name, mode, window_size, world_size=1, rank=0, tasks=TASKS, **extra):
    if library == "torchrec":
        cls = getattr(importlib.import_module(f"torchrec.metrics.{MODULES[name]}"), name)
        config = importlib.import_module("torchrec.metrics.metrics_config")
    else:
        cls, config = OURS[name], importlib.import_module("rectoolkit.metrics.metrics_config")
    return cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=[config.RecTaskInfo(name=t) for t in tasks],
               compute_mode=getattr(config.RecComputeMode, mode), window_size=window_size, **extra)


def assert_same_values(got, expected):
    assert list(got) == list(expected)  # the same keys in the same order
    for key, value in expected.items():
        assert got[key].shape == value.shape, key  # [1] unfused, 0-d fused
        # TorchRec sums float32 inputs into float64 states after a float32 product; rectoolkit in float64
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, equal_nan=True, msg=key)


@pytest.mark.torchrec
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("name, extra", CASES)
@pytest.mark.parametrize("window_size", [20, 10_000])  # 20: the window drops batches, windowed != lifetime
def test_same_keys_values_and_state_dict_as_torchrec(name, extra, mode, window_size, ties):
    pytest.importorskip("torchrec")
    theirs = make("torchrec", name, mode, window_size, **extra)
    ours = make("rectoolkit", name, mode, window_size, **extra)
    stream = batches(count=24, ties=ties)  # WeightedAvgMetric's window of 20 holds 20 updates (10 fused)
    expected, got = feed(theirs, stream), feed(ours, stream)
    assert_same_values(got, expected)
    if window_size == 20:
        lifetime, window = (got[key] for key in list(got)[:2])
        assert not torch.equal(lifetime, window)
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        assert our_state[key].dtype == value.dtype and our_state[key].shape == value.shape, key
        torch.testing.assert_close(our_state[key], value, rtol=1e-6, atol=1e-7, msg=key)
    # each library resumes from the other's state: the lifetime values carry on, the window starts empty
    resumed_ours, resumed_theirs = make("rectoolkit", name, mode, window_size, **extra), \
        make("torchrec", name, mode, window_size, **extra)
    resumed_ours.load_state_dict(their_state)
    resumed_theirs.load_state_dict(our_state)
    later = batches(count=2, seed=9, ties=ties)
    assert_same_values(feed(resumed_ours, later), feed(resumed_theirs, later))


def test_hand_worked_values():
    task = [RecTaskInfo(name="t")]
    predictions, labels = torch.tensor([0.9, 0.5, 0.2, 0.5]), torch.tensor([1.0, 0.0, 1.0, 1.0])
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def value(cls, name, **extra):
        metric = cls(world_size=1, my_rank=0, batch_size=4, tasks=task, **extra)
        metric.update(predictions={"t": predictions}, labels={"t": labels}, weights={"t": weights})
        return float(metric.compute()[f"{name}-t|lifetime_{name}"])

    # at 0.5: decisions (1, 1, 0, 1); right on samples 1 and 4 (weights 1 + 4 of 10)
    assert value(AccuracyMetric, "accuracy") == pytest.approx(5 / 10)
    # predicted positives weigh 1 + 2 + 4, of which labelled positive 1 + 4
    assert value(PrecisionMetric, "precision") == pytest.approx(5 / 7)
    # TP = 1 + 4; FN counts prediction <= 0.5 with label 1: samples 3 and 4 (3 + 4), as TorchRec
    assert value(RecallMetric, "recall") == pytest.approx(5 / 12)
    assert value(RecallMetric, "recall", threshold=0.6) == pytest.approx(1 / 8)
    assert value(MAEMetric, "mae") == pytest.approx((0.1 * 1 + 0.5 * 2 + 0.8 * 3 + 0.5 * 4) / 10)
    assert value(WeightedAvgMetric, "weighted_avg") == pytest.approx((0.9 + 1.0 + 0.6 + 2.0) / 10)
    # positives' cross-entropy in bits over the base rate's (ctr = 8/10)
    positives_bits = -(1 * math.log2(0.9) + 3 * math.log2(0.2) + 4 * math.log2(0.5))
    assert value(NEPositiveMetric, "ne_positive") == pytest.approx(
        positives_bits / (-8 * math.log2(0.8) - 2 * math.log2(0.2)))


def test_empty_denominators_give_torchrecs_defaults():
    task = [RecTaskInfo(name="t")]
    zeros = {"t": torch.zeros(2)}
    for cls, name in ((MAEMetric, "mae"), (AccuracyMetric, "accuracy"), (PrecisionMetric, "precision"),
                      (RecallMetric, "recall")):
        metric = cls(world_size=1, my_rank=0, batch_size=2, tasks=task)
        metric.update(predictions=zeros, labels=zeros, weights=zeros)
        assert float(metric.compute()[f"{name}-t|lifetime_{name}"]) == 0.0, name
    missing = NEPositiveMetric(world_size=1, my_rank=0, batch_size=2, tasks=task,
                               allow_missing_label_with_zero_weight=True)
    missing.update(predictions=zeros, labels=zeros, weights=zeros)
    assert float(missing.compute()["ne_positive-t|lifetime_ne_positive"]) == 1e-12
    average = WeightedAvgMetric(world_size=1, my_rank=0, batch_size=2, tasks=task)
    average.update(predictions=zeros, labels=zeros, weights=zeros)
    assert torch.isnan(average.compute()["weighted_avg-t|lifetime_weighted_avg"]).all()  # as TorchRec: no guard


@pytest.mark.parametrize("cls", [AccuracyMetric, PrecisionMetric, RecallMetric])
def test_bad_threshold_and_shapes_are_refused_by_name(cls):
    task = [RecTaskInfo(name="t")]
    for threshold in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=rf"{cls.__name__}: threshold={threshold} is outside \[0, 1\]"):
            cls(world_size=1, my_rank=0, batch_size=2, tasks=task, threshold=threshold)
    with pytest.raises(TypeError, match=r"threshold='0.5' is not a number"):
        cls(world_size=1, my_rank=0, batch_size=2, tasks=task, threshold="0.5")
    with pytest.raises(ValueError, match=r"unknown or unimplemented argument cutoff=0.3"):
        cls(world_size=1, my_rank=0, batch_size=2, tasks=task, cutoff=0.3)
    metric = cls(world_size=1, my_rank=0, batch_size=2, tasks=task)
    with pytest.raises(ValueError, match="task 't' has 2 predictions but 3 labels"):
        metric.update(predictions={"t": torch.rand(2)}, labels={"t": torch.ones(3)}, weights=None)
    with pytest.raises(ValueError, match="task 't' has 2 predictions but 1 weights"):
        metric.update(predictions={"t": torch.rand(2)}, labels={"t": torch.ones(2)}, weights={"t": torch.ones(1)})


@pytest.mark.torchrec
def test_generate_metric_module_builds_them_as_torchrec():
    pytest.importorskip("torchrec")
    from torchrec.metrics import metric_module as theirs_module
    from torchrec.metrics import metrics_config as theirs_config

    from rectoolkit.metrics import metrics_config as ours_config

    def config(package):
        tasks = [package.RecTaskInfo(name="click", label_name="y", prediction_name="p", weight_name="w")]
        metrics = {getattr(package.RecMetricEnum, m): package.RecMetricDef(rec_task_indices=[0], window_size=24)
                   for m in ("MAE", "ACCURACY", "PRECISION", "RECALL", "WEIGHTED_AVG", "NE_POSITIVE")}
        metrics[package.RecMetricEnum.RECALL].arguments = {"threshold": 0.3}
        return package.MetricsConfig(rec_tasks=tasks, rec_metrics=metrics, throughput_metric=None)

    modules = [library.generate_metric_module(library.RecMetricModule, config(package), batch_size=BATCH,
                                              world_size=1, my_rank=0, state_metrics_mapping={},
                                              device=torch.device("cpu"))
               for library, package in ((theirs_module, theirs_config),
                                        (importlib.import_module("rectoolkit.metrics.metric_module"), ours_config))]
    for predictions, labels, weights in batches(tasks=["click"]):
        for module in modules:
            module.update({"p": predictions["click"], "y": labels["click"], "w": weights["click"]})
    expected, got = (dict(module.compute()) for module in modules)
    assert sorted(got) == sorted(expected) and len(got) == 12
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)
    assert list(modules[1].state_dict()) == list(modules[0].state_dict())


# ------------------------------------------------------------------------------------------------ 2 ranks
RANK_CASES = [("MAEMetric", {}), ("WeightedAvgMetric", {}), ("NEPositiveMetric", {}), ("AccuracyMetric", {}),
              ("PrecisionMetric", {"threshold": 0.25}), ("RecallMetric", {"threshold": 0.5})]


def _metrics(world_size, rank):
    return [make("rectoolkit", name, "UNFUSED_TASKS_COMPUTATION", 4 * BATCH, world_size, rank,
                 compute_on_all_ranks=True, **extra) for name, extra in RANK_CASES]


def _two_rank_worker(rank, world_size, stream, expected):
    from tests.metrics.test_gauc_ndcg_vs_torchrec import feed_session_metrics

    got = {}
    for metric in _metrics(world_size, rank):
        got.update(feed(metric, stream[rank::world_size]))
    got.update(feed_session_metrics(stream[rank::world_size], world_size, rank))  # GAUC, NDCG
    assert list(got) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-12, msg=f"rank {rank} {key}")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_each_with_half_the_data_equal_one_process_with_all():
    from tests.distributed.dist_harness import run_workers

    stream = batches(count=10, seed=3, ties=True)
    # rank r gets batches r, r + 2, ...; the global window (32 samples) is the last 4 batches in one process and
    # the last 2 of each rank, so windowed and lifetime values differ and both must match (WeightedAvgMetric's
    # window of 32 updates holds them all)
    from tests.metrics.test_gauc_ndcg_vs_torchrec import feed_session_metrics

    expected = {}
    for metric in _metrics(1, 0):
        expected.update(feed(metric, stream))
    expected.update(feed_session_metrics(stream))
    assert len(expected) == 2 * 2 * len(RANK_CASES) + 2 * 4 + 2 * 2  # GAUC: 4 keys a task, NDCG: 2
    assert float(expected["mae-click|lifetime_mae"]) != float(expected["mae-click|window_mae"])
    assert float(expected["gauc-click|lifetime_gauc"]) != float(expected["gauc-click|window_gauc"])
    assert float(expected["ndcg-like|lifetime_ndcg"]) != float(expected["ndcg-like|window_ndcg"])
    run_workers(_two_rank_worker, 2, stream, expected)
