"""rectoolkit.metrics against TorchRec 1.8's metric classes (run on CPU) on the same stream of batches, against
hand-worked numbers, and across 2 gloo ranks (each rank half the data == one process on all of it)."""

import math

import pytest
import torch

from rectoolkit.metrics import (AUCMetric, CalibrationMetric, CTRMetric, MetricsConfig, MSEMetric, NEMetric,
                                RecComputeMode, RecMetricDef, RecMetricEnum, RecMetricModule, RecTaskInfo,
                                generate_metric_module)
from rectoolkit.metrics.auc import weighted_auc

TASKS = ["click", "like"]
BATCH = 8


def batches(count=7, seed=0, tasks=TASKS, batch=BATCH):
    """A stream of {task: tensor} batches: predictions in (0, 1) without ties, 0/1 labels, weights in [0.5, 2]."""
    generator = torch.Generator().manual_seed(seed)
    stream = []
    for _ in range(count):
        predictions = {t: torch.rand(batch, generator=generator) * 0.98 + 0.01 for t in tasks}
        labels = {t: (torch.rand(batch, generator=generator) < predictions[t]).float() for t in tasks}
        weights = {t: torch.rand(batch, generator=generator) * 1.5 + 0.5 for t in tasks}
        stream.append((predictions, labels, weights))
    return stream


def feed(metric, stream):
    for predictions, labels, weights in stream:
        metric.update(predictions=predictions, labels=labels, weights=weights)
    return {key: float(value) for key, value in metric.compute().items()}


CLASSES = ["NEMetric", "AUCMetric", "CalibrationMetric", "CTRMetric", "MSEMetric"]
OURS = {"NEMetric": NEMetric, "AUCMetric": AUCMetric, "CalibrationMetric": CalibrationMetric, "CTRMetric": CTRMetric,
        "MSEMetric": MSEMetric}
MODULES = {"NEMetric": "ne", "AUCMetric": "auc", "CalibrationMetric": "calibration", "CTRMetric": "ctr",
           "MSEMetric": "mse"}


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("window_size", [20, 10_000])  # 20: the window drops batches (and cuts AUC's mid-batch)
def test_same_values_and_keys_as_torchrec(name, mode, window_size):
    import importlib

    torchrec_module = importlib.import_module(f"torchrec.metrics.{MODULES[name]}")
    from torchrec.metrics.metrics_config import RecComputeMode as TorchRecMode
    from torchrec.metrics.metrics_config import RecTaskInfo as TorchRecTask

    extra = {"NEMetric": {"include_logloss": True}, "MSEMetric": {"include_r_squared": True}}.get(name, {})
    theirs = getattr(torchrec_module, name)(world_size=1, my_rank=0, batch_size=BATCH,
                                            tasks=[TorchRecTask(name=t) for t in TASKS],
                                            compute_mode=getattr(TorchRecMode, mode), window_size=window_size, **extra)
    ours = OURS[name](world_size=1, my_rank=0, batch_size=BATCH, tasks=[RecTaskInfo(name=t) for t in TASKS],
                      compute_mode=getattr(RecComputeMode, mode), window_size=window_size, **extra)
    stream = batches()
    expected, got = feed(theirs, stream), feed(ours, stream)
    assert list(got) == list(expected)  # the same keys in the same order (loggers print them in this order)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key
    theirs_value = next(iter(theirs.compute().values()))
    assert next(iter(ours.compute().values())).shape == theirs_value.shape  # [1] unfused, 0-d fused


def _modules_fed_alike(config, names=("p", "y", "w")):
    """TorchRec's and our generate_metric_module of `config(package)`, fed the same stream; (ours, theirs, got,
    expected) with the computed values as floats."""
    from torchrec.metrics import metric_module as theirs_module
    from torchrec.metrics import metrics_config as theirs_config

    import rectoolkit.metrics.metrics_config as ours_config

    theirs = theirs_module.generate_metric_module(theirs_module.RecMetricModule, config(theirs_config), batch_size=BATCH,
                                                  world_size=1, my_rank=0, state_metrics_mapping={},
                                                  device=torch.device("cpu"))
    ours = generate_metric_module(RecMetricModule, config(ours_config), batch_size=BATCH, world_size=1, my_rank=0,
                                  state_metrics_mapping={}, device=torch.device("cpu"))
    for predictions, labels, weights in batches(tasks=["click"]):
        model_out = dict(zip(names, (predictions["click"], labels["click"], weights["click"])))
        theirs.update(model_out)
        ours.update(model_out)
    expected = {key: float(value) for key, value in theirs.compute().items()}
    got = {key: float(value) for key, value in ours.compute().items()}
    return ours, theirs, got, expected


@pytest.mark.torchrec
def test_generate_metric_module_matches_torchrecs():
    def config(package):
        tasks = [package.RecTaskInfo(name="click", label_name="y", prediction_name="p", weight_name="w")]
        metrics = {getattr(package.RecMetricEnum, m): package.RecMetricDef(rec_task_indices=[0], window_size=24)
                   for m in ("NE", "AUC", "CALIBRATION", "CTR")}
        return package.MetricsConfig(rec_tasks=tasks, rec_metrics=metrics, throughput_metric=None)

    ours, theirs, got, expected = _modules_fed_alike(config)
    assert sorted(got) == sorted(expected) and len(got) == 7
    assert all(got[key] == pytest.approx(expected[key], rel=1e-6) for key in expected)
    assert ours.should_compute() == theirs.should_compute()
    assert ours.get_required_inputs() is None and theirs.get_required_inputs() is None
    assert ours.rec_metrics[0].get_required_inputs() == theirs.rec_metrics[0].get_required_inputs() == set()


@pytest.mark.torchrec
def test_torchrecs_other_task_fields_are_accepted_and_change_nothing_as_in_torchrec():
    def config(package):
        task = package.RecTaskInfo(name="click", is_negative_task=True, tensor_name="extra", weighted=False)
        metrics = {getattr(package.RecMetricEnum, m): package.RecMetricDef(rec_tasks=[task], window_size=24)
                   for m in ("NE", "CALIBRATION", "MSE")}
        return package.MetricsConfig(rec_tasks=[task], rec_metrics=metrics, throughput_metric=None,
                                     use_cpu_offloaded_rec_metric_module=None)

    _, _, got, expected = _modules_fed_alike(config, names=("prediction", "label", "weight"))
    assert sorted(got) == sorted(expected)
    assert all(got[key] == pytest.approx(expected[key], rel=1e-6) for key in expected)
    offloaded = MetricsConfig(rec_tasks=[RecTaskInfo()], rec_metrics={RecMetricEnum.NE: RecMetricDef(
        rec_task_indices=[0])}, use_cpu_offloaded_rec_metric_module=True)
    with pytest.raises(NotImplementedError, match="use_cpu_offloaded_rec_metric_module=True is not implemented"):
        generate_metric_module(RecMetricModule, offloaded, BATCH, 1, 0, {}, torch.device("cpu"))


@pytest.mark.parametrize("name", ["metrics_namespace", "metric_module", "metrics_config", "rec_metric", "ne", "auc",
                                  "calibration", "ctr", "mse", "computation"])
def test_docstring_examples(name):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module(f"rectoolkit.metrics.{name}")).failed == 0


@pytest.mark.torchrec
@pytest.mark.parametrize("name", CLASSES)
def test_compute_keys_are_the_ones_torchrecs_compose_metric_key_builds(name):
    from torchrec.metrics import metrics_namespace as theirs

    from rectoolkit.metrics import metrics_namespace as ours

    extra = {"NEMetric": {"include_logloss": True}, "MSEMetric": {"include_r_squared": True}}.get(name, {})
    metric = OURS[name](world_size=1, my_rank=0, batch_size=BATCH, tasks=[RecTaskInfo(name="click")], **extra)
    keys = list(feed(metric, batches(count=2, tasks=["click"])))
    for key in keys:
        prefix, metric_name = key.split("|")[1].split("_", 1)
        namespace_value = key.split("-")[0]
        for package in (ours, theirs):
            assert package.compose_metric_key(package.MetricNamespace(namespace_value), "click",
                                              package.MetricName(metric_name),
                                              package.MetricPrefix(prefix + "_")) == key, (package, key)


def test_hand_worked_values():
    task = [RecTaskInfo(name="t")]
    ne = NEMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, window_size=2)
    # batch 1: labels (1, 0), predictions (0.8, 0.4): CE = -log2 0.8 - log2 0.6; base rate 1/2: 2 bits
    ne.update(predictions={"t": torch.tensor([0.8, 0.4])}, labels={"t": torch.tensor([1.0, 0.0])}, weights=None)
    first = -math.log2(0.8) - math.log2(0.6)
    assert float(ne.compute()["ne-t|lifetime_ne"]) == pytest.approx(first / 2.0)
    # batch 2: one positive scored 0.5 (1 bit); lifetime base rate 2/3 over 3 samples; window holds batch 2 only
    ne.update(predictions={"t": torch.tensor([0.5, 0.5])}, labels={"t": torch.tensor([1.0, 1.0])},
              weights={"t": torch.tensor([1.0, 0.0])})
    entropy = -2 * math.log2(2 / 3) - math.log2(1 / 3)
    values = ne.compute()
    assert float(values["ne-t|lifetime_ne"]) == pytest.approx((first + 1.0) / entropy)
    assert float(values["ne-t|window_ne"]) == pytest.approx(1.0 / -math.log2(1 - 1e-12), rel=1e-9)
    # weighted AUC: positives (0.9, w=2), (0.3, w=1); negatives (0.5, w=1), (0.3, w=3): pairs 2*4 + 1*(0 + 3/2)
    assert float(weighted_auc(torch.tensor([0.9, 0.3, 0.5, 0.3]), torch.tensor([1.0, 1.0, 0.0, 0.0]),
                              torch.tensor([2.0, 1.0, 1.0, 3.0]))) == pytest.approx(9.5 / 12)
    assert float(weighted_auc(torch.tensor([0.2, 0.7]), torch.ones(2), torch.ones(2))) == 0.5


def test_tensor_inputs_and_skipped_tasks():
    tasks = [RecTaskInfo(name=t) for t in TASKS]
    by_dict = CTRMetric(world_size=1, my_rank=0, batch_size=4, tasks=tasks, window_size=8)
    by_tensor = CTRMetric(world_size=1, my_rank=0, batch_size=4, tasks=tasks, window_size=8)
    labels = torch.tensor([[1.0, 0, 0, 0], [1, 1, 1, 0]])
    by_dict.update(predictions={"click": torch.zeros(4), "like": torch.zeros(4)},
                   labels={"click": labels[0], "like": labels[1]}, weights=None)
    by_tensor.update(predictions=torch.zeros(2, 4), labels=labels, weights=None)
    as_floats = [{key: float(value) for key, value in m.compute().items()} for m in (by_dict, by_tensor)]
    assert as_floats[0] == as_floats[1]
    assert float(by_tensor.compute()["ctr-like|lifetime_ctr"]) == 0.75
    by_dict.update(predictions={"click": torch.zeros(4)}, labels={"click": torch.ones(4)}, weights=None)  # no "like"
    assert float(by_dict.compute()["ctr-like|lifetime_ctr"]) == 0.75
    assert float(by_dict.compute()["ctr-click|lifetime_ctr"]) == 5 / 8


def test_refusals_name_the_argument():
    task = [RecTaskInfo(name="t")]
    with pytest.raises(ValueError, match="local window.*batch_size=8"):
        NEMetric(world_size=2, my_rank=0, batch_size=8, tasks=task, window_size=10)
    with pytest.raises(ValueError, match="grouped_auc"):
        AUCMetric(world_size=1, my_rank=0, batch_size=8, tasks=task, grouped_auc=True)
    with pytest.raises(NotImplementedError, match="should_validate_update"):
        NEMetric(world_size=1, my_rank=0, batch_size=8, tasks=task, should_validate_update=True)
    with pytest.raises(TypeError, match="throughput_metric=<object .*> is not a ThroughputMetric"):
        RecMetricModule(batch_size=8, world_size=1, throughput_metric=object())
    metric = NEMetric(world_size=1, my_rank=0, batch_size=2, tasks=task)
    with pytest.raises(ValueError, match="task 't' has 2 predictions but 3 labels"):
        metric.update(predictions={"t": torch.rand(2)}, labels={"t": torch.ones(3)}, weights=None)
    module = generate_metric_module(RecMetricModule, MetricsConfig(rec_tasks=task, rec_metrics={
        RecMetricEnum.NE: RecMetricDef(rec_task_indices=[0])}), 2, 1, 0, {}, torch.device("cpu"))
    with pytest.raises(ValueError, match="task 't' reads 'weight'"):
        module.update({"label": torch.ones(2), "prediction": torch.rand(2)})
    two_ranks = CTRMetric(world_size=2, my_rank=0, batch_size=2, tasks=task, window_size=8)
    with pytest.raises(Exception, match="world_size=2 but torch.distributed is not initialized"):
        two_ranks.compute()


# ------------------------------------------------------------------------------------------------ 2 ranks
def _all_metrics(world_size, rank, compute_on_all_ranks=True):
    tasks = [RecTaskInfo(name=t) for t in TASKS]
    return [cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=tasks, window_size=4 * BATCH,
                compute_on_all_ranks=compute_on_all_ranks)
            for cls in (NEMetric, AUCMetric, CalibrationMetric, CTRMetric, MSEMetric)]


def _two_rank_worker(rank, world_size, stream, expected):
    got, rank0_only = {}, {}
    for metric, only_rank0 in zip(_all_metrics(world_size, rank), _all_metrics(world_size, rank, False)):
        got.update(feed(metric, stream[rank::world_size]))
        rank0_only.update(feed(only_rank0, stream[rank::world_size]))
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-9), (rank, key)
    assert rank0_only == (got if rank == 0 else {})


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_each_with_half_the_data_equal_one_process_with_all():
    from tests.distributed.dist_harness import run_workers

    stream = batches(count=10, seed=3)
    # one process sees the batches in order; rank r gets batches r, r + 2, ...; the global window (32 samples)
    # is the last 4 batches in one process and the last 2 of each rank
    expected = {}
    for metric in _all_metrics(1, 0):
        expected.update(feed(metric, stream))
    assert len(expected) == 2 * (2 + 1 + 2 + 2 + 4)
    run_workers(_two_rank_worker, 2, stream, expected)


def _torchrec_metric(name, mode, **extra):
    import importlib

    from torchrec.metrics.metrics_config import RecComputeMode as TorchRecMode
    from torchrec.metrics.metrics_config import RecTaskInfo as TorchRecTask

    cls = getattr(importlib.import_module(f"torchrec.metrics.{MODULES[name]}"), name)
    return cls(world_size=1, my_rank=0, batch_size=BATCH, tasks=[TorchRecTask(name=t) for t in TASKS],
               compute_mode=getattr(TorchRecMode, mode), window_size=20, **extra)


def _our_metric(name, mode, **extra):
    return OURS[name](world_size=1, my_rank=0, batch_size=BATCH, tasks=[RecTaskInfo(name=t) for t in TASKS],
                      compute_mode=getattr(RecComputeMode, mode), window_size=20, **extra)


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("name, extra", [("NEMetric", {}), ("AUCMetric", {}), ("CalibrationMetric", {}),
                                         ("CTRMetric", {}), ("MSEMetric", {}), ("MSEMetric", {"include_r_squared": True})])
def test_state_dict_keys_and_values_equal_torchrecs_and_each_loads_the_others(name, mode, extra):
    theirs, ours = _torchrec_metric(name, mode, **extra), _our_metric(name, mode, **extra)
    feed(theirs, batches(count=5))
    feed(ours, batches(count=5))
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        assert our_state[key].dtype == value.dtype and our_state[key].shape == value.shape, key
        # TorchRec sums each batch in float32 (its inputs' dtype), rectoolkit in float64
        torch.testing.assert_close(our_state[key], value, rtol=1e-6, atol=1e-9, msg=key)
    # each library resumes from the other's state: the lifetime values carry on, the window starts empty
    resumed_ours, resumed_theirs = _our_metric(name, mode, **extra), _torchrec_metric(name, mode, **extra)
    resumed_ours.load_state_dict(their_state)
    resumed_theirs.load_state_dict(our_state)
    later = batches(count=2, seed=9)
    expected, got = feed(resumed_theirs, later), feed(resumed_ours, later)
    assert set(got) == set(expected)
    for key in expected:
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9, nan_ok=True), key


def test_metric_module_state_dict_round_trip_and_a_wrong_shape_changes_nothing():
    config = MetricsConfig(rec_tasks=[RecTaskInfo(name=t) for t in TASKS],
                           rec_metrics={RecMetricEnum.NE: RecMetricDef(rec_tasks=[RecTaskInfo(name=t) for t in TASKS],
                                                                       window_size=40)})
    module = generate_metric_module(RecMetricModule, config, batch_size=BATCH, world_size=1, my_rank=0,
                                    state_metrics_mapping={}, device=torch.device("cpu"))
    stream = batches(count=3)
    for predictions, labels, weights in stream:
        module.rec_metrics.update(predictions=predictions, labels=labels, weights=weights)
    state = module.state_dict()
    assert sorted(state) == sorted(f"rec_metrics.rec_metrics.0._metrics_computations.{i}.{s}" for i in range(2)
                                   for s in ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"))
    # the sums by hand: task 0's weighted number of samples and positives
    assert float(state["rec_metrics.rec_metrics.0._metrics_computations.0.weighted_num_samples"]) == pytest.approx(
        sum(float(w["click"].sum()) for _, _, w in stream))
    assert float(state["rec_metrics.rec_metrics.0._metrics_computations.0.pos_labels"]) == pytest.approx(
        sum(float((w["click"] * y["click"]).sum()) for _, y, w in stream))
    fresh = generate_metric_module(RecMetricModule, config, batch_size=BATCH, world_size=1, my_rank=0,
                                   state_metrics_mapping={}, device=torch.device("cpu"))
    fresh.load_state_dict(state)
    lifetime = {k: v for k, v in module.compute().items() if "lifetime" in k}
    assert {k: float(v) for k, v in fresh.compute().items() if "lifetime" in k} == \
        {k: float(v) for k, v in lifetime.items()}
    bad = dict(state)
    bad["rec_metrics.rec_metrics.0._metrics_computations.1.pos_labels"] = torch.zeros(3, dtype=torch.float64)
    other = generate_metric_module(RecMetricModule, config, batch_size=BATCH, world_size=1, my_rank=0,
                                   state_metrics_mapping={}, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match=r"_metrics_computations.1.pos_labels has shape \(3,\), expected \(1,\)"):
        other.load_state_dict(bad)
    assert all(float(v) == 0 for v in other.state_dict().values())
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict({k: v for k, v in state.items() if "neg_labels" not in k})


def test_get_memory_usage_maps_every_tensor_held_to_its_bytes():
    # TorchRec's RecMetric.get_memory_usage: {tensor: bytes}; counted here by hand from what the metrics keep
    tasks = [RecTaskInfo(name="t")]
    ctr = CTRMetric(world_size=1, my_rank=0, batch_size=2, tasks=tasks, window_size=4)
    auc = AUCMetric(world_size=1, my_rank=0, batch_size=2, tasks=tasks, window_size=4)
    for metric in (ctr, auc):
        for _ in range(3):
            metric.update(predictions={"t": torch.tensor([0.2, 0.7])}, labels={"t": torch.tensor([0.0, 1.0])},
                          weights=None)
    # CTR: lifetime [1 task, 2 sums] + window total [2] + the window's 2 batches [2] each, all float64
    assert sorted(ctr.get_memory_usage().values()) == [16, 16, 16, 16]
    # AUC: the window's 2 batches of [3 (prediction, label, weight), 2 samples] float64
    assert sorted(auc.get_memory_usage().values()) == [48, 48]
