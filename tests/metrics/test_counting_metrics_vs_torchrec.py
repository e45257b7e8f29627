"""The counting and averaging metrics (number of positive samples, of missing labels, sum of weights, weighted sum of
predictions, label / prediction average, XAUC, multiclass recall, hindsight target PR) against TorchRec 1.8's on the
same batches: keys, values, state_dict (and each loading the other's), alone and through generate_metric_module;
hand-worked values; two gloo ranks against one process."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

from tests.metrics.torchrec_pairs import assert_same_values, feed_both, generate_both  # noqa: E402

TASKS = ["click", "like"]
BATCH, CLASSES = 6, 4
# module: (class, extra arguments, input kind)
CASES = {
    "num_positive_samples": ("NumPositiveSamplesMetric", {}, "missing"),
    "num_missing_labels": ("NumMissingLabelsMetric", {}, "missing"),
    "sum_weights": ("SumWeightsMetric", {}, "binary"),
    "weighted_sum_predictions": ("WeightedSumPredictionsMetric", {}, "binary"),
    "average": ("AverageMetric", {}, "binary"),
    "xauc": ("XAUCMetric", {}, "graded"),
    "multiclass_recall": ("MulticlassRecallMetric", {"number_of_classes": CLASSES}, "multiclass"),
    "hindsight_target_pr": ("HindsightTargetPRMetric", {"target_precision": 0.8}, "informative"),
}
MODES = ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION", "FUSED_TASKS_AND_STATES_COMPUTATION"]


def batches(kind, count=5, seed=0, tasks=TASKS):
    """[(predictions, labels, weights)] of {task: tensor}: binary labels (informative: predictions that lean to them),
    nan-missing labels, graded labels (0..3, with tied predictions), or class indices with [batch, classes] scores;
    weights in [0, 2) (some 0)."""
    generator = torch.Generator().manual_seed(seed)
    stream = []
    for _ in range(count):
        predictions, labels, weights = {}, {}, {}
        for task in tasks:
            if kind == "multiclass":
                predictions[task] = torch.rand(BATCH, CLASSES, generator=generator)
                labels[task] = torch.randint(0, CLASSES, (BATCH,), generator=generator).float()
            else:
                predictions[task] = torch.rand(BATCH, generator=generator)
                if kind == "graded":
                    predictions[task] = torch.randint(0, 4, (BATCH,), generator=generator) / 4.0
                labels[task] = torch.randint(0, 4 if kind == "graded" else 2, (BATCH,), generator=generator).float()
                if kind == "informative":  # positives score higher: the precision rises with the threshold
                    predictions[task] = 0.6 * predictions[task] + 0.4 * labels[task]
                if kind == "missing":
                    labels[task][torch.rand(BATCH, generator=generator) < 0.3] = float("nan")
            weights[task] = torch.rand(BATCH, generator=generator) * 2 * (torch.rand(BATCH, generator=generator) > 0.1)
        stream.append((predictions, labels, weights))
    return stream


def make(library, module, mode, window_size, tasks=TASKS, world_size=1, rank=0, **kwargs):
    name, extra, _ = CASES[module]
    cls = getattr(importlib.import_module(f"{library}.metrics.{module}"), name)
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    return cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=[config.RecTaskInfo(name=t) for t in tasks],
               compute_mode=getattr(config.RecComputeMode, mode), window_size=window_size, **extra, **kwargs)


def feed(metric, stream):
    for predictions, labels, weights in stream:
        metric.update(predictions=predictions, labels=labels, weights=weights)
    return metric.compute()


def assert_same_values_(got, expected):
    """TorchRec's threshold index is torch.Tensor(index), an uninitialized tensor of index elements: not compared."""
    assert_same_values(got, expected, skip=is_threshold_index)


def is_threshold_index(key):
    return key.endswith("_hindsight_target_pr")


def their_threshold_index(metric, window, task_index):
    """TorchRec's own threshold search on a task's states (its reported index is garbage; see assert_same_values)."""
    from torchrec.metrics.hindsight_target_pr import compute_threshold_idx

    computation = metric._metrics_computations[task_index]

    def state(name):
        return computation.get_window_state(name) if window else getattr(computation, name)

    return compute_threshold_idx(state("true_pos_sum"), state("false_pos_sum"), computation._target_precision)


def supported(module, mode):
    """TorchRec's hindsight target PR keeps [1000] states without a task row: its fused modes fail in compute();
    rectoolkit's (with [n_tasks, 1000] states) report what TorchRec's unfused mode does."""
    return not (module == "hindsight_target_pr" and mode != "UNFUSED_TASKS_COMPUTATION")


@pytest.mark.torchrec
@pytest.mark.parametrize("window_size", [2 * BATCH, 10_000])  # 2 batches: the window drops batches
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module", list(CASES))
def test_same_keys_values_and_state_dict_as_torchrec(module, mode, window_size):
    ours = make("rectoolkit", module, mode, window_size)
    theirs = make("torchrec", module, mode if supported(module, mode) else "UNFUSED_TASKS_COMPUTATION", window_size)
    stream = batches(CASES[module][2])
    expected, got = feed(theirs, stream), feed(ours, stream)
    if not supported(module, mode):  # against TorchRec's unfused values, whose keys come task by task
        expected, got = dict(sorted(expected.items())), dict(sorted(got.items()))
    assert_same_values_(got, expected)
    if supported(module, mode):
        assert_same_values_(ours.local_compute(), theirs.local_compute())
    if window_size == 2 * BATCH:  # the window is not the lifetime
        lifetime, window = [got[key] for key in got if "lifetime" in key], [got[key] for key in got if "window" in key]
        assert any(not torch.equal(a, b) for a, b in zip(lifetime, window))
    if module == "hindsight_target_pr":
        for prefix, window in (("lifetime", False), ("window", True)):
            values = [float(got[f"hindsight_target_pr-{t}|{prefix}_hindsight_target_pr"]) for t in TASKS]
            assert values == [float(their_threshold_index(theirs, window, i)) for i in range(len(TASKS))]
            assert len(set(values)) > 1 or prefix == "window"
        if not supported(module, mode):
            assert {value.shape for value in ours.state_dict().values()} == {(len(TASKS), 1000)}
            return
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        assert our_state[key].dtype == value.dtype and our_state[key].shape == value.shape, key
        torch.testing.assert_close(our_state[key], value, rtol=1e-6, atol=1e-9, msg=key)
    # each library resumes from the other's state: the lifetime carries on, the window starts empty
    resumed_ours, resumed_theirs = (make(library, module, mode, window_size) for library in ("rectoolkit", "torchrec"))
    resumed_ours.load_state_dict(their_state)
    resumed_theirs.load_state_dict(our_state)
    later = batches(CASES[module][2], count=2, seed=7)
    assert_same_values_(feed(resumed_ours, later), feed(resumed_theirs, later))


@pytest.mark.torchrec
def test_generate_metric_module_builds_them_as_torchrec():
    def config(package, members, arguments):
        tasks = [package.RecTaskInfo(name=t, label_name=f"{t}_y", prediction_name=f"{t}_p", weight_name=f"{t}_w")
                 for t in TASKS]
        metrics = {getattr(package.RecMetricEnum, member): package.RecMetricDef(rec_task_indices=[0, 1], window_size=12,
                                                                               arguments=arguments)
                   for member in members}
        return package.MetricsConfig(rec_tasks=tasks, rec_metrics=metrics, throughput_metric=None)

    groups = [(["NUM_POSITIVE_SAMPLES", "NUM_MISSING_LABELS", "SUM_WEIGHTS", "WEIGHTED_SUM_PREDICTIONS", "AVERAGE",
                "XAUC"], None, "missing"),
              (["HINDSIGHT_TARGET_PR"], {"target_precision": 0.7}, "informative"),
              (["MULTICLASS_RECALL"], {"number_of_classes": CLASSES}, "multiclass")]
    for members, arguments, kind in groups:
        modules = generate_both(lambda package: config(package, members, arguments), BATCH)
        expected, got = feed_both(modules, batches(kind), TASKS)
        assert_same_values_(got, expected)
        assert len(got) >= 4 * len(members)
        assert list(modules[1].state_dict()) == list(modules[0].state_dict())


def test_hand_worked_values():
    from rectoolkit.metrics import (AverageMetric, MulticlassRecallMetric, NumMissingLabelsMetric,
                                    NumPositiveSamplesMetric, SumWeightsMetric, WeightedSumPredictionsMetric, XAUCMetric)
    from rectoolkit.metrics.metrics_config import RecTaskInfo

    task = [RecTaskInfo(name="t")]
    predictions, labels = torch.tensor([0.9, 0.5, 0.2, 0.5]), torch.tensor([1.0, 0.0, float("nan"), 2.0])
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def values(cls, **extra):
        metric = cls(world_size=1, my_rank=0, batch_size=4, tasks=task, **extra)
        metric.update(predictions={"t": predictions}, labels={"t": labels}, weights={"t": weights})
        return {key: value.tolist() for key, value in metric.compute().items() if "lifetime" in key}

    assert values(NumPositiveSamplesMetric) == {"num_positive_samples-t|lifetime_num_positive_samples": [1.0 + 8.0]}
    assert values(NumMissingLabelsMetric) == {"num_missing_labels-t|lifetime_num_missing_labels": [3.0]}
    assert values(SumWeightsMetric) == {"sum_weights-t|lifetime_sum_weights": [10.0]}
    assert values(WeightedSumPredictionsMetric)["weighted_sum_predictions-t|lifetime_weighted_sum_predictions"] == \
        pytest.approx([0.9 + 1.0 + 0.6 + 2.0])
    clean = torch.tensor([1.0, 0.0, 0.0, 2.0])
    metric = AverageMetric(world_size=1, my_rank=0, batch_size=4, tasks=task)
    metric.update(predictions={"t": predictions}, labels={"t": clean}, weights={"t": weights})
    got = {key: float(value) for key, value in metric.compute().items()}
    assert got["average-t|lifetime_label_average"] == pytest.approx(9 / 10)
    assert got["average-t|window_prediction_average"] == pytest.approx(4.5 / 10)
    # XAUC pairs (weight w_i w_j): (0,1) agree 2, (0,2) agree 3, (0,3) disagree 4, (1,2) disagree 6,
    # (1,3) tie vs 0<2: disagree 8, (2,3) agree 12
    metric = XAUCMetric(world_size=1, my_rank=0, batch_size=4, tasks=task)
    metric.update(predictions={"t": predictions}, labels={"t": clean}, weights={"t": weights})
    assert float(metric.compute()["xauc-t|lifetime_xauc"]) == pytest.approx((2 + 3 + 12) / (2 + 3 + 4 + 6 + 8 + 12))
    # top-k: sample 0's class 1 is ranked 2nd, sample 1's class 0 ranked 1st
    metric = MulticlassRecallMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, number_of_classes=3)
    metric.update(predictions={"t": torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]])},
                  labels={"t": torch.tensor([1.0, 0.0])}, weights={"t": torch.tensor([1.0, 3.0])})
    assert metric.compute()["multiclass_recall-t|lifetime_multiclass_recall"].tolist() == [[0.75, 1.0, 1.0]]
    # without weights every sample weighs 1 (TorchRec's default weights have the predictions' shape and fail)
    metric.reset()
    metric.update(predictions={"t": torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.1, 0.3]])},
                  labels={"t": torch.tensor([1.0, 0.0])}, weights=None)
    assert metric.compute()["multiclass_recall-t|lifetime_multiclass_recall"].tolist() == [[0.5, 1.0, 1.0]]


def test_bad_input_is_refused_by_name():
    from rectoolkit.metrics import MulticlassRecallMetric, SumWeightsMetric
    from rectoolkit.metrics.metrics_config import RecTaskInfo
    from rectoolkit.metrics.rec_metric import RecMetricException

    task = [RecTaskInfo(name="t")]
    with pytest.raises(ValueError, match="number_of_classes=0 must be a positive int"):
        MulticlassRecallMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, number_of_classes=0)
    metric = MulticlassRecallMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, number_of_classes=3)
    with pytest.raises(RecMetricException, match=r"expected \[batch, number_of_classes=3\]"):
        metric.update(predictions={"t": torch.rand(2, 5)}, labels={"t": torch.zeros(2)}, weights=None)
    with pytest.raises(TypeError, match=r"unexpected arguments \['colour'\]"):
        SumWeightsMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, colour="red")


# ------------------------------------------------------------------------------------------------ 2 ranks
RANK_MODULES = ["num_positive_samples", "average", "xauc", "multiclass_recall", "hindsight_target_pr"]


def _two_rank_worker(rank, world_size, expected):
    for module in RANK_MODULES:
        metric = make("rectoolkit", module, "UNFUSED_TASKS_COMPUTATION", 2 * BATCH, world_size=world_size, rank=rank,
                      compute_on_all_ranks=True)
        got = feed(metric, batches(CASES[module][2], count=6, seed=3)[rank::world_size])
        assert list(got) == list(expected[module])
        for key, value in expected[module].items():
            if "lifetime" in key:  # the window: each rank's last batch, not the stream's last two
                torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-12, msg=f"rank {rank} {key}")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_each_with_half_the_data_equal_one_process_with_all():
    from tests.distributed.dist_harness import run_workers

    expected = {module: feed(make("rectoolkit", module, "UNFUSED_TASKS_COMPUTATION", 2 * BATCH),
                             batches(CASES[module][2], count=6, seed=3)) for module in RANK_MODULES}
    run_workers(_two_rank_worker, 2, expected)
