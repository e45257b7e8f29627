"""The metrics' RecMetricComputation classes at TorchRec's paths (`torchrec.metrics.ne.NEMetricComputation`, ...),
built directly with TorchRec's arguments and fed the same [n_tasks, batch] inputs in TorchRec 1.8 and rectoolkit:
the same states (names, dtypes, values, window included) after every update, the same state_dict, and the same
compute() / local_compute() reports. Then the same computations run inside a RecMetric written the TorchRec way
(`_computation_class = ...`), fused and unfused, and a user subclass of one."""

import importlib

import pytest
import torch

from tests.metrics.torchrec_pairs import user_metrics

torchrec = pytest.importorskip("torchrec")

N_TASKS, BATCH, WINDOW = 2, 4, 10  # the window (10 samples) holds the last two batches of 4

# (module, computation class, constructor keywords) at TorchRec's paths
COMPUTATIONS = [
    ("ne", "NEMetricComputation", {}),
    ("ne", "NEMetricComputation", {"include_logloss": True}),
    ("ne", "NEMetricComputation", {"allow_missing_label_with_zero_weight": True}),
    ("ctr", "CTRMetricComputation", {}),
    ("calibration", "CalibrationMetricComputation", {}),
    ("mse", "MSEMetricComputation", {}),
    ("mse", "MSEMetricComputation", {"include_r_squared": True}),
    ("mae", "MAEMetricComputation", {}),
    ("accuracy", "AccuracyMetricComputation", {}),
    ("accuracy", "AccuracyMetricComputation", {"threshold": 0.3}),
    ("precision", "PrecisionMetricComputation", {"threshold": 0.6}),
    ("recall", "RecallMetricComputation", {}),
    ("weighted_avg", "WeightedAvgMetricComputation", {}),
    ("ne_positive", "NEPositiveMetricComputation", {}),
    ("ne_positive", "NEPositiveMetricComputation", {"allow_missing_label_with_zero_weight": True}),
    ("cali_free_ne", "CaliFreeNEMetricComputation", {}),
    ("cali_free_ne", "CaliFreeNEMetricComputation", {"allow_missing_label_with_zero_weight": True}),
    ("unweighted_ne", "UnweightedNEMetricComputation", {}),
    ("unweighted_ne", "UnweightedNEMetricComputation", {"allow_missing_label_with_zero_weight": True}),
    ("nmse", "NMSEMetricComputation", {}),
    ("nmse", "NMSEMetricComputation", {"include_r_squared": True}),
    ("calibration_with_recalibration", "RecalibratedCalibrationMetricComputation", {"recalibration_coefficient": 0.3}),
    ("ne_with_recalibration", "RecalibratedNEMetricComputation", {"recalibration_coefficient": 0.3}),
]
IDS = [f"{cls}{kwargs or ''}" for _, cls, kwargs in COMPUTATIONS]


def _class(library, module, name):
    return getattr(importlib.import_module(f"{library}.metrics.{module}"), name)


def _batches(seed, weighted, count=4, n_tasks=N_TASKS):
    """[n_tasks, BATCH] predictions, 0/1 labels and weights: random (weighted True), ones (False), or random with
    the last task's all 0 ("zero_task": the metrics' empty-task cases)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        predictions = torch.rand(n_tasks, BATCH, generator=generator)
        labels = (torch.rand(n_tasks, BATCH, generator=generator) > 0.5).float()
        weights = torch.rand(n_tasks, BATCH, generator=generator) if weighted else torch.ones(n_tasks, BATCH)
        if weighted == "zero_task":
            weights[-1] = 0.0
        out.append((predictions, labels, weights))
    return out


def _states(computation):
    """{state name: tensor} of every state the computation added (torchmetrics' and ours keep them in _defaults)."""
    return {name: getattr(computation, name) for name in computation._defaults}


def _assert_same_tensors(got, expected, what):
    assert list(got) == list(expected), what
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, (what, key)
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-9, equal_nan=True, msg=f"{what}: {key}")


def _reports(reports):
    return {(str(report.name), str(report.metric_prefix), report.description): report.value for report in reports}


def _assert_same_reports(got, expected):
    assert [(str(r.name), str(r.metric_prefix), r.description) for r in got] == \
        [(str(r.name), str(r.metric_prefix), r.description) for r in expected]
    _assert_same_tensors(_reports(got), _reports(expected), "reports")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weighted", [True, False, "zero_task"])
@pytest.mark.parametrize("module, name, kwargs", COMPUTATIONS, ids=IDS)
def test_computation_states_and_reports_equal_torchrec(module, name, kwargs, weighted, seed):
    built = [_class(library, module, name)(my_rank=0, batch_size=BATCH, n_tasks=N_TASKS, window_size=WINDOW,
                                           **kwargs) for library in ("torchrec", "rectoolkit")]
    expected, got = built
    _assert_same_tensors(_states(got), _states(expected), "initial states")
    for predictions, labels, weights in _batches(seed, weighted):
        for computation in built:
            computation.update(predictions=predictions.clone(), labels=labels.clone(), weights=weights.clone())
        _assert_same_tensors(_states(got), _states(expected), "states after update")
        _assert_same_reports(got.compute(), expected.compute())
        _assert_same_reports(got.local_compute(), expected.local_compute())
    _assert_same_tensors(dict(got.state_dict()), dict(expected.state_dict()), "state_dict")
    for computation in built:
        computation.reset()
    _assert_same_tensors(_states(got), _states(expected), "states after reset")


@pytest.mark.parametrize("module, name", sorted({(m, c) for m, c, _ in COMPUTATIONS
                                                 if m not in ("accuracy", "precision", "recall")}))
def test_update_without_weights_is_refused_as_torchrec(module, name):
    """TorchRec's sum computations (but accuracy / precision / recall) refuse weights=None with RecMetricException
    (weighted_avg's fails on None * tensor: a TypeError; ours says what to pass)."""
    for library in ("torchrec", "rectoolkit"):
        computation = _class(library, module, name)(my_rank=0, batch_size=BATCH, n_tasks=1, window_size=WINDOW)
        exception = _class(library, "rec_metric", "RecMetricException")
        if library == "torchrec" and module == "weighted_avg":
            exception = TypeError
        with pytest.raises(exception, match="weights" if library == "rectoolkit" else None):
            computation.update(predictions=torch.rand(1, BATCH), labels=torch.ones(1, BATCH), weights=None)


@pytest.mark.parametrize("module, name", [("accuracy", "AccuracyMetricComputation"),
                                          ("precision", "PrecisionMetricComputation"),
                                          ("recall", "RecallMetricComputation")])
def test_thresholded_computations_take_no_weights_as_torchrec(module, name):
    built = [_class(library, module, name)(my_rank=0, batch_size=BATCH, n_tasks=1, window_size=WINDOW)
             for library in ("torchrec", "rectoolkit")]
    predictions, labels, _ = _batches(3, True, count=1, n_tasks=1)[0]
    for computation in built:
        computation.update(predictions=predictions, labels=labels, weights=None)
    _assert_same_tensors(_states(built[1]), _states(built[0]), "states")
    _assert_same_reports(built[1].compute(), built[0].compute())


@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("module, name, kwargs", COMPUTATIONS, ids=IDS)
def test_rec_metric_with_the_computation_equals_torchrec(module, name, kwargs, mode):
    tasks = ["click", "like"]
    metrics = user_metrics(module, name, "NE", tasks, mode, batch_size=BATCH, window_size=WINDOW, **kwargs)
    expected, got = metrics
    for seed, weighted in ((5, True), (6, False)):
        for predictions, labels, weights in _batches(seed, weighted, count=3):
            batch = [{t: tensor[i] for i, t in enumerate(tasks)} for tensor in (predictions, labels, weights)]
            for metric in metrics:
                metric.update(predictions=batch[0], labels=batch[1], weights=batch[2] if weighted else None)
            _assert_same_tensors(got.compute(), expected.compute(), "compute")
    _assert_same_tensors(got.local_compute(), expected.local_compute(), "local_compute")
    _assert_same_tensors(dict(got.state_dict()), dict(expected.state_dict()), "state_dict")


def _subclass(library, metric_base):
    """A user computation subclassing NEMetricComputation (NE, and the batch count it keeps beside), run by a
    subclass of `metric_base` (RecMetric, or NEMetric with its computation replaced)."""
    ne = importlib.import_module(f"{library}.metrics.ne")
    rec_metric = importlib.import_module(f"{library}.metrics.rec_metric")
    namespace = importlib.import_module(f"{library}.metrics.metrics_namespace")

    class CountingNE(ne.NEMetricComputation):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._add_state("batches", torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=False,
                            dist_reduce_fx="sum", persistent=True)

        def update(self, *, predictions, labels, weights, **kwargs):
            super().update(predictions=predictions, labels=labels, weights=weights, **kwargs)
            self.batches += 1.0

        def _compute(self):
            return super()._compute() + [rec_metric.MetricComputationReport(
                name=namespace.MetricName.NE, metric_prefix=namespace.MetricPrefix.LIFETIME,
                value=self.cross_entropy_sum / self.batches, description="_per_batch")]

    base = rec_metric.RecMetric if metric_base == "RecMetric" else ne.NEMetric

    class CountingNEMetric(base):
        _namespace = namespace.MetricNamespace.NE
        _computation_class = CountingNE

    return CountingNEMetric


@pytest.mark.parametrize("metric_base", ["RecMetric", "NEMetric"])
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_user_subclass_of_ne_computation_equals_torchrec(mode, metric_base):
    tasks = ["click", "like"]
    metrics = []
    for library in ("torchrec", "rectoolkit"):
        config = importlib.import_module(f"{library}.metrics.metrics_config")
        metrics.append(_subclass(library, metric_base)(world_size=1, my_rank=0, batch_size=BATCH,
                                          tasks=[config.RecTaskInfo(name=t) for t in tasks],
                                          compute_mode=getattr(config.RecComputeMode, mode), window_size=WINDOW,
                                          include_logloss=True))
    for predictions, labels, weights in _batches(9, True):
        batch = [{t: tensor[i] for i, t in enumerate(tasks)} for tensor in (predictions, labels, weights)]
        for metric in metrics:
            metric.update(predictions=batch[0], labels=batch[1], weights=batch[2])
    _assert_same_tensors(metrics[1].compute(), metrics[0].compute(), "compute")
    _assert_same_tensors(dict(metrics[1].state_dict()), dict(metrics[0].state_dict()), "state_dict")
    saved = dict(metrics[0].state_dict())
    for metric in metrics:
        metric.reset()
    _assert_same_tensors(dict(metrics[1].state_dict()), dict(metrics[0].state_dict()), "state_dict after reset")
    for metric in metrics:
        metric.load_state_dict(saved)  # TorchRec's saved state, loaded by both
    _assert_same_tensors(dict(metrics[1].state_dict()), saved, "state_dict after load")
    for predictions, labels, weights in _batches(10, True, count=1):
        batch = [{t: tensor[i] for i, t in enumerate(tasks)} for tensor in (predictions, labels, weights)]
        for metric in metrics:
            metric.update(predictions=batch[0], labels=batch[1], weights=batch[2])
    _assert_same_tensors(metrics[1].compute(), metrics[0].compute(), "compute after load")


def test_recalibrated_computations_refuse_what_torchrec_ignores_or_cannot_use():
    """TorchRec's RecalibratedNEMetricComputation drops include_logloss / allow_missing_label_with_zero_weight (its
    NE base resets them) and takes any coefficient; ours refuses them by name."""
    ne_computation = _class("rectoolkit", "ne_with_recalibration", "RecalibratedNEMetricComputation")
    calibration_computation = _class("rectoolkit", "calibration_with_recalibration",
                                     "RecalibratedCalibrationMetricComputation")
    arguments = {"my_rank": 0, "batch_size": BATCH, "n_tasks": 1, "window_size": WINDOW}
    for option in ("include_logloss", "allow_missing_label_with_zero_weight"):
        with pytest.raises(ValueError, match=f"RecalibratedNEMetricComputation: {option}=True is not supported"):
            ne_computation(**arguments, **{option: True})
    for computation in (ne_computation, calibration_computation):
        with pytest.raises(ValueError, match=r"recalibration_coefficient=0 must be a positive finite number"):
            computation(**arguments, recalibration_coefficient=0)


def _required_input_metrics(library):
    """(metric, the required input it reads) per metric class: a user metric written the TorchRec way, and
    TorchRec's metrics that read a per-sample required input through their computation."""
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    rec_metric = importlib.import_module(f"{library}.metrics.rec_metric")
    namespace = importlib.import_module(f"{library}.metrics.metrics_namespace")
    ctr = importlib.import_module(f"{library}.metrics.ctr")

    class BonusCTR(ctr.CTRMetricComputation):
        def update(self, *, predictions, labels, weights, **kwargs):
            super().update(predictions=predictions, labels=labels + kwargs["required_inputs"]["bonus"],
                           weights=weights)

    class BonusMetric(rec_metric.RecMetric):
        _namespace = namespace.MetricNamespace.CTR
        _computation_class = BonusCTR

        def _get_task_required_inputs(self, task_config):
            return {"bonus"}

    arguments = {"world_size": 1, "my_rank": 0, "batch_size": BATCH, "window_size": WINDOW}
    tensor_weighted_avg = importlib.import_module(f"{library}.metrics.tensor_weighted_avg")
    segmented_ne = importlib.import_module(f"{library}.metrics.segmented_ne")
    return [
        (BonusMetric(tasks=[config.RecTaskInfo(name="click")], **arguments), "bonus"),
        (tensor_weighted_avg.TensorWeightedAvgMetric(
            tasks=[config.RecTaskInfo(name="click", tensor_name="dwell")], **arguments), "dwell"),
        (segmented_ne.SegmentedNEMetric(tasks=[config.RecTaskInfo(name="click")], num_groups=3, **arguments),
         "grouping_keys"),
    ]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_required_input_of_the_wrong_length_is_refused_by_name(index):
    """Unfused, a required input of another length than the batch: TorchRec fails in view (RuntimeError), ours
    names the metric, task, input and both lengths; one per sample or a single value run in both, alike."""
    (expected, name), (got, _) = (_required_input_metrics(library)[index] for library in ("torchrec", "rectoolkit"))
    predictions, labels, weights = ({"click": tensor[0]} for tensor in _batches(11, True, count=1, n_tasks=1)[0])
    wrong = {name: torch.ones(BATCH + 2, dtype=torch.long)}
    with pytest.raises(RuntimeError):
        expected.update(predictions=predictions, labels=labels, weights=weights, required_inputs=wrong)
    # (SegmentedNEMetric checks its grouping keys itself, in its own words)
    message = (rf"{type(got).__name__}: task 'click': required input '{name}' has {BATCH + 2} values but the "
               rf"task's batch has {BATCH} samples" if index < 2 else rf"'{name}' has {BATCH + 2} values for {BATCH}")
    with pytest.raises(ValueError, match=message):
        got.update(predictions=predictions, labels=labels, weights=weights, required_inputs=wrong)
    for good in (torch.tensor([0, 1, 2, 1])[:BATCH], torch.tensor([1])):
        for metric in (expected, got):
            metric.update(predictions=predictions, labels=labels, weights=weights, required_inputs={name: good})
    _assert_same_tensors(got.compute(), expected.compute(), "compute")


# ------------------------------------------------------------------------------------------------ 2 ranks
def _two_rank_worker(rank, world_size):
    """Both libraries' computations on one gloo group, each rank with its own batches: the same reports (states
    summed over the ranks) on every rank, and this rank's own states kept after compute()."""
    for module, name, kwargs in COMPUTATIONS:
        built = [_class(library, module, name)(my_rank=rank, batch_size=BATCH, n_tasks=N_TASKS, window_size=WINDOW,
                                               compute_on_all_ranks=True, **kwargs)
                 for library in ("torchrec", "rectoolkit")]
        for predictions, labels, weights in _batches(40 + rank, True, count=3):
            for computation in built:
                computation.update(predictions=predictions, labels=labels, weights=weights)
            _assert_same_reports(built[1].compute(), built[0].compute())
            _assert_same_tensors(_states(built[1]), _states(built[0]), f"rank {rank} local states")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_reduce_the_states_as_torchrec():
    from tests.distributed.dist_harness import run_workers

    run_workers(_two_rank_worker, 2)
