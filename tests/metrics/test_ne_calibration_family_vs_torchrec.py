"""The NE / calibration family (cali-free NE, recalibrated NE and calibration, unweighted NE, NMSE, serving NE and
calibration, segmented NE) against TorchRec 1.8's classes on the same batches: keys in order, values, dtypes and
shapes, state_dict; through generate_metric_module; hand-worked values; bad inputs; 2 gloo ranks."""

import importlib
import math

import pytest
import torch

from tests.metrics.test_rec_metrics import batches as random_batches

torchrec = pytest.importorskip("torchrec")

TASKS = ["click", "like"]
BATCH = 8
MODULES = {"CaliFreeNEMetric": "cali_free_ne", "RecalibratedNEMetric": "ne_with_recalibration",
           "RecalibratedCalibrationMetric": "calibration_with_recalibration", "UnweightedNEMetric": "unweighted_ne",
           "NMSEMetric": "nmse", "ServingNEMetric": "serving_ne", "ServingCalibrationMetric": "serving_calibration",
           "SegmentedNEMetric": "segmented_ne"}
CASES = [("CaliFreeNEMetric", {}), ("CaliFreeNEMetric", {"allow_missing_label_with_zero_weight": True}),
         ("RecalibratedNEMetric", {}), ("RecalibratedNEMetric", {"recalibration_coefficient": 0.25}),
         ("RecalibratedCalibrationMetric", {}), ("RecalibratedCalibrationMetric", {"recalibration_coefficient": 0.1}),
         ("UnweightedNEMetric", {}), ("UnweightedNEMetric", {"allow_missing_label_with_zero_weight": True}),
         ("NMSEMetric", {}), ("NMSEMetric", {"include_r_squared": True}), ("ServingNEMetric", {}),
         ("ServingCalibrationMetric", {})]
MODES = ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION", "FUSED_TASKS_AND_STATES_COMPUTATION"]


def batches(count=12, seed=0, tasks=TASKS, regression=False):
    """test_rec_metrics' stream (predictions in (0, 1), 0/1 labels, weights in [0.5, 2]); with regression, labels
    and predictions in [0, 3)."""
    stream = random_batches(count=count, seed=seed, tasks=tasks, batch=BATCH)
    if not regression:
        return stream
    return [({t: p[t] * 3 for t in tasks}, {t: (l[t] + p[t]) * 1.5 for t in tasks}, w) for p, l, w in stream]


def make(library, name, mode, window_size, world_size=1, rank=0, tasks=TASKS, **extra):
    package = "torchrec" if library == "torchrec" else "rectoolkit"
    cls = getattr(importlib.import_module(f"{package}.metrics.{MODULES[name]}"), name)
    config = importlib.import_module(f"{package}.metrics.metrics_config")
    return cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=[config.RecTaskInfo(name=t) for t in tasks],
               compute_mode=getattr(config.RecComputeMode, mode), window_size=window_size, **extra)


def feed(metric, stream, **kwargs):
    for predictions, labels, weights in stream:
        metric.update(predictions=predictions, labels=labels, weights=weights, **kwargs)
    return metric.compute()


def assert_same_values(got, expected):
    assert list(got) == list(expected)  # the same keys in the same order
    for key, value in expected.items():
        # dtype and shape as TorchRec's; TorchRec sums float32 products into float64 states, rectoolkit in float64
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, equal_nan=True, msg=key)


def assert_same_state_dict(ours, theirs):
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        torch.testing.assert_close(our_state[key], value, rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name, extra", CASES)
@pytest.mark.parametrize("window_size", [20, 10_000])  # 20: the window drops batches, windowed != lifetime
def test_same_keys_values_and_state_dict_as_torchrec(name, extra, mode, window_size):
    theirs = make("torchrec", name, mode, window_size, **extra)
    ours = make("rectoolkit", name, mode, window_size, **extra)
    stream = batches(regression=name == "NMSEMetric")
    expected, got = feed(theirs, stream), feed(ours, stream)
    assert_same_values(got, expected)
    if window_size == 20:
        first = list(got)[0]
        assert not torch.equal(got[first], got[first.replace("|lifetime_", "|window_")])
    assert_same_state_dict(ours, theirs)
    # and each loads the other's lifetime sums
    fresh = make("rectoolkit", name, mode, window_size, **extra)
    fresh.load_state_dict(theirs.state_dict())
    for key, value in fresh.compute().items():
        if "lifetime" in key:
            torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7, msg=key)


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", MODES[:2])
@pytest.mark.parametrize("name", ["CaliFreeNEMetric", "UnweightedNEMetric", "NMSEMetric",
                                  "RecalibratedCalibrationMetric", "ServingNEMetric", "ServingCalibrationMetric"])
def test_empty_and_zero_weight_tasks_as_torchrec(name, mode):
    """A task whose weights are all 0 (UnweightedNE still counts its samples), one with some weights 0 (the serving
    metrics do not count them)."""
    stream = [(p, l, {"click": torch.zeros(BATCH), "like": w["like"] * (torch.arange(BATCH) % 3 > 0)})
              for p, l, w in batches(count=3)]
    theirs = make("torchrec", name, mode, 10_000)
    ours = make("rectoolkit", name, mode, 10_000)
    assert_same_values(feed(ours, stream), feed(theirs, stream))


def test_hand_worked_values():
    from rectoolkit.metrics.cali_free_ne import CaliFreeNEMetric
    from rectoolkit.metrics.calibration_with_recalibration import RecalibratedCalibrationMetric
    from rectoolkit.metrics.metrics_config import RecTaskInfo
    from rectoolkit.metrics.ne_with_recalibration import RecalibratedNEMetric
    from rectoolkit.metrics.nmse import NMSEMetric
    from rectoolkit.metrics.unweighted_ne import UnweightedNEMetric

    def one(cls, predictions, labels, weights=None, **extra):
        metric = cls(world_size=1, my_rank=0, batch_size=len(predictions), tasks=[RecTaskInfo(name="t")], **extra)
        metric.update(predictions={"t": torch.tensor(predictions)}, labels={"t": torch.tensor(labels)},
                      weights=None if weights is None else {"t": torch.tensor(weights)})
        return {key.split("|")[1]: float(value) for key, value in metric.compute().items() if "lifetime" in key}

    # p = 0.5 with c = 1/3: p' = 0.5 / (0.5 + 0.5 * 3) = 1/4; labels 1, 0: CE = 2 + log2(4/3) bits; base 2 bits
    ne = one(RecalibratedNEMetric, [0.5, 0.5], [1.0, 0.0], recalibration_coefficient=1 / 3)["lifetime_ne"]
    assert ne == pytest.approx((2 + math.log2(4 / 3)) / 2)
    calibration = one(RecalibratedCalibrationMetric, [0.5, 0.5], [1.0, 0.0], recalibration_coefficient=1 / 3)
    assert calibration["lifetime_calibration"] == pytest.approx(0.5)
    # weights 3 and 1 ignored: two samples, CE of p = 0.8 on labels 1, 0 = log2(1.25) + log2(5) bits over 2 bits
    unweighted = one(UnweightedNEMetric, [0.8, 0.8], [1.0, 0.0], [3.0, 1.0])["lifetime_unweighted_ne"]
    assert unweighted == pytest.approx((math.log2(1.25) + math.log2(5)) / 2)
    # NE of p = 0.8 on labels 1, 0 over the entropy of always predicting the mean prediction 0.8
    cali_free = one(CaliFreeNEMetric, [0.8, 0.8], [1.0, 0.0])["lifetime_cali_free_ne"]
    assert cali_free == pytest.approx(((math.log2(1.25) + math.log2(5)) / 2) / (math.log2(1.25) + math.log2(5)))
    # errors 1, 4 (weights 1, 2) over the errors of predicting 1: (2 - 1)^2 + 2 (3 - 1)^2
    nmse = one(NMSEMetric, [1.0, 1.0], [2.0, 3.0], [1.0, 2.0])
    assert nmse["lifetime_nmse"] == pytest.approx(9 / 9) and nmse["lifetime_nrmse"] == pytest.approx(1.0)
    nmse = one(NMSEMetric, [2.0, 3.0], [2.0, 5.0], [1.0, 1.0])
    assert nmse["lifetime_nmse"] == pytest.approx(4 / 17) and nmse["lifetime_nrmse"] == pytest.approx(math.sqrt(4 / 17))


@pytest.mark.parametrize("value", [0, -0.5, float("inf"), float("nan"), "0.5", True])
@pytest.mark.parametrize("name", ["RecalibratedNEMetric", "RecalibratedCalibrationMetric"])
def test_bad_recalibration_coefficient_is_refused_by_name(name, value):
    with pytest.raises(ValueError, match="recalibration_coefficient"):
        make("rectoolkit", name, MODES[0], 100, recalibration_coefficient=value)


@pytest.mark.parametrize("option", ["include_logloss", "allow_missing_label_with_zero_weight"])
def test_recalibrated_ne_refuses_the_options_torchrec_ignores(option):
    with pytest.raises(ValueError, match=option):
        make("rectoolkit", "RecalibratedNEMetric", MODES[0], 100, **{option: True})
    make("rectoolkit", "RecalibratedNEMetric", MODES[0], 100, **{option: False})


@pytest.mark.parametrize("name, extra", [("UnweightedNEMetric", {"include_logloss": True}),
                                         ("CaliFreeNEMetric", {"include_logloss": False}), ("NMSEMetric", {"foo": 1})])
def test_unknown_arguments_are_refused_as_torchrec(name, extra):
    with pytest.raises(ValueError, match=list(extra)[0]):
        make("torchrec", name, MODES[0], 100, **extra)
    with pytest.raises(ValueError, match=list(extra)[0]):
        make("rectoolkit", name, MODES[0], 100, **extra)


GENERATED = {"RECALIBRATED_NE": {"recalibration_coefficient": 0.5},
             "RECALIBRATED_CALIBRATION": {"recalibration_coefficient": 0.5}, "CALI_FREE_NE": None,
             "UNWEIGHTED_NE": None, "NMSE": None, "SERVING_NE": None, "SERVING_CALIBRATION": None}


def generated_modules(mode, arguments_by_member):
    """TorchRec's and rectoolkit's RecMetricModule from one MetricsConfig: the members with their arguments, over
    both tasks, each task's label, prediction and weight under y_, p_ and w_{task}."""
    from torchrec.metrics import metric_module as theirs_module
    from torchrec.metrics import metrics_config as theirs_config

    from rectoolkit.metrics import metric_module as ours_module
    from rectoolkit.metrics import metrics_config as ours_config

    def config(package):
        tasks = [package.RecTaskInfo(name=t, label_name=f"y_{t}", prediction_name=f"p_{t}", weight_name=f"w_{t}")
                 for t in TASKS]
        metrics = {getattr(package.RecMetricEnum, member): package.RecMetricDef(
            rec_task_indices=[0, 1], window_size=24, arguments=arguments)
            for member, arguments in arguments_by_member.items()}
        return package.MetricsConfig(rec_tasks=tasks, rec_metrics=metrics, throughput_metric=None,
                                     rec_compute_mode=getattr(package.RecComputeMode, mode))

    return [library.generate_metric_module(library.RecMetricModule, config(package), batch_size=BATCH,
                                           world_size=1, my_rank=0, state_metrics_mapping={},
                                           device=torch.device("cpu"))
            for library, package in ((theirs_module, theirs_config), (ours_module, ours_config))]


def model_output(predictions, labels, weights):
    return {f"{name}_{t}": value[t] for t in TASKS for name, value in (("p", predictions), ("y", labels), ("w", weights))}


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", MODES[:2])
def test_generate_metric_module_builds_them_as_torchrec(mode):
    modules = generated_modules(mode, GENERATED)
    for predictions, labels, weights in batches(count=5):
        for module in modules:
            module.update(model_output(predictions, labels, weights))
    expected, got = (dict(module.compute()) for module in modules)
    assert len(expected) == 2 * 2 * 6 + 2 * 3 * 2
    assert_same_values(got, expected)
    assert list(modules[1].state_dict()) == list(modules[0].state_dict())


@pytest.mark.parametrize("name", ["ServingNEMetric", "ServingCalibrationMetric"])
def test_serving_metrics_refuse_what_torchrec_ignores_and_mismatched_inputs(name):
    with pytest.raises(ValueError, match="allow_missing_label_with_zero_weight"):
        make("rectoolkit", name, MODES[0], 100, allow_missing_label_with_zero_weight=True)
    metric = make("rectoolkit", name, MODES[0], 100)
    with pytest.raises(ValueError, match="weights"):
        metric.update(predictions={"click": torch.rand(BATCH)}, labels={"click": torch.ones(BATCH)},
                      weights={"click": torch.ones(BATCH - 1)})


def test_serving_total_examples_hand_worked():
    metric = make("rectoolkit", "ServingNEMetric", "FUSED_TASKS_COMPUTATION", 100)
    weights = {"click": torch.tensor([0.0, 1, 2, 0, 0, 1, 1, 1]), "like": torch.zeros(BATCH)}
    for _ in range(2):
        metric.update(predictions={t: torch.full((BATCH,), 0.5) for t in TASKS},
                      labels={t: torch.ones(BATCH) for t in TASKS}, weights=weights)
    values = metric.compute()
    assert values["serving_ne-click|total_examples"].tolist() == 10
    assert values["serving_ne-like|total_examples"].dtype == torch.int64
    assert values["serving_ne-like|total_examples"].tolist() == 0
    assert list(metric.local_compute())[-1] == "serving_ne-like|local_total_examples"


# ------------------------------------------------------------------------------------------------ segmented NE
def segment_stream(count=12, seed=5, names=("grouping_keys",), num_groups=(3,), dtype=torch.int64):
    """batches() with a group id per sample under each name; group 2 of 3 is left empty in the first batches."""
    generator = torch.Generator().manual_seed(seed)
    stream = []
    for index, (p, l, w) in enumerate(batches(count=count, seed=seed)):
        groups = {name: torch.randint(0, n if index > 3 else max(n - 1, 1), (BATCH,), generator=generator).to(dtype)
                  for name, n in zip(names, num_groups)}
        stream.append((p, l, w, groups))
    return stream


def feed_segments(metric, stream):
    for predictions, labels, weights, groups in stream:
        metric.update(predictions=predictions, labels=labels, weights=weights, required_inputs=groups)
    return metric.compute()


def grouping_configs(library):
    config = getattr(importlib.import_module(f"{library}.metrics.segmented_ne"), "GroupingKeyConfig")
    return [config(name="age", num_groups=3), config(name="country", num_groups=2, cast_keys_to_int=True)]


SEGMENT_CASES = [  # (arguments, key names, their group counts, key dtype)
    ({"num_groups": 3}, ("grouping_keys",), (3,), torch.int64),
    ({"num_groups": 3, "include_logloss": True}, ("grouping_keys",), (3,), torch.int64),
    ({"num_groups": 2, "grouping_keys": "segment", "cast_keys_to_int": True}, ("segment",), (2,), torch.float32),
    ({"num_groups": 3, "grouping_keys": ["age", {"name": "country", "num_groups": 2}], "include_logloss": True},
     ("age", "country"), (3, 2), torch.int64),
    ({"grouping_keys": "configs"}, ("age", "country"), (3, 2), torch.float64),
]


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", range(len(SEGMENT_CASES)))
@pytest.mark.parametrize("window_size", [24, 10_000])
def test_segmented_ne_same_keys_values_and_state_dict_as_torchrec(case, mode, window_size):
    extra, names, num_groups, dtype = SEGMENT_CASES[case]
    stream = segment_stream(names=names, num_groups=num_groups, dtype=dtype)
    if dtype == torch.float64:  # GroupingKeyConfigs: only "country" casts its float keys
        stream = [(p, l, w, {"age": g["age"].long(), "country": g["country"]}) for p, l, w, g in stream]
    metrics = []
    for library in ("torchrec", "rectoolkit"):
        arguments = dict(extra, grouping_keys=grouping_configs(library)) if extra.get("grouping_keys") == "configs" \
            else extra
        metrics.append(make(library, "SegmentedNEMetric", mode, window_size, **arguments))
    theirs, ours = metrics
    assert ours.get_required_inputs() == set(theirs.get_required_inputs()) == set(names)
    expected, got = feed_segments(theirs, stream), feed_segments(ours, stream)
    assert len(expected) == 2 * 2 * sum(num_groups) * (2 if extra.get("include_logloss") else 1)
    assert_same_values(got, expected)
    assert_same_state_dict(ours, theirs)


def test_segmented_ne_hand_worked():
    metric = make("rectoolkit", "SegmentedNEMetric", "UNFUSED_TASKS_COMPUTATION", 100, tasks=["t"], num_groups=3,
                  include_logloss=True)
    metric.update(predictions={"t": torch.tensor([0.5, 0.5, 0.8, 0.8, 0.5, 0.5, 0.5, 0.5])},
                  labels={"t": torch.tensor([1.0, 0, 1, 0, 1, 1, 1, 0])},
                  weights={"t": torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0])},
                  required_inputs={"grouping_keys": torch.tensor([0, 0, 1, 1, 0, 0, 0, 0])})
    values = {key.split("|")[1]: float(value) for key, value in metric.compute().items()}
    # group 0: p = 1/2 at the base rate 1/2: NE 1, logloss 1 bit; group 1: CE log2(1.25) + log2(5) over 2 bits
    assert values["lifetime_segmented_ne_0"] == pytest.approx(1.0)
    assert values["lifetime_logloss_0"] == pytest.approx(1.0)
    assert values["lifetime_segmented_ne_1"] == pytest.approx((math.log2(1.25) + math.log2(5)) / 2, rel=1e-6)
    assert math.isnan(values["lifetime_segmented_ne_2"]) and values["lifetime_logloss_2"] == 0.0


@pytest.mark.parametrize("required, match", [
    ({}, "grouping_keys"),
    ({"grouping_keys": torch.zeros(BATCH, dtype=torch.int32)}, "torch.int32"),
    ({"grouping_keys": torch.zeros(BATCH)}, "cast_keys_to_int"),
    ({"grouping_keys": torch.tensor([0, 1, 2, 3, 0, 0, 0, 0])}, "value 3 outside"),
    ({"grouping_keys": torch.tensor([0, -1, 0, 0, 0, 0, 0, 0])}, "value -1 outside"),
    ({"grouping_keys": torch.zeros(BATCH - 1, dtype=torch.int64)}, "7 values for 8 samples"),
])
@pytest.mark.parametrize("mode", MODES[:2])
def test_segmented_ne_bad_grouping_keys_are_refused_by_name(required, match, mode):
    metric = make("rectoolkit", "SegmentedNEMetric", mode, 100, num_groups=3)
    with pytest.raises((ValueError, KeyError, torchrec_exception()), match=match):
        metric.update(predictions={t: torch.rand(BATCH) for t in TASKS}, labels={t: torch.ones(BATCH) for t in TASKS},
                      weights=None, required_inputs=required)


def torchrec_exception():
    from rectoolkit.metrics.rec_metric import RecMetricException
    return RecMetricException


@pytest.mark.parametrize("extra, match", [({"num_groups": 0}, "num_groups=0"), ({"grouping_keys": []}, "empty"),
                                          ({"grouping_keys": ["a", "a"]}, "repeat"),
                                          ({"grouping_keys": [3]}, "Invalid grouping_keys item type"),
                                          ({"allow_missing_label_with_zero_weight": True}, "allow_missing")])
def test_segmented_ne_bad_arguments_are_refused_by_name(extra, match):
    with pytest.raises(ValueError, match=match):
        make("rectoolkit", "SegmentedNEMetric", MODES[0], 100, **extra)


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", MODES[:2])
def test_generate_metric_module_feeds_segmented_ne_its_grouping_keys_as_torchrec(mode):
    modules = generated_modules(mode, {"SEGMENTED_NE": {"num_groups": 3, "grouping_keys": "country"}})
    assert modules[1].get_required_inputs() == modules[0].get_required_inputs() == ["country"]
    for predictions, labels, weights, groups in segment_stream(count=6, names=("country",)):
        for module in modules:
            module.update({**model_output(predictions, labels, weights), "country": groups["country"]})
    expected, got = (dict(module.compute()) for module in modules)
    assert len(expected) == 2 * 2 * 3
    assert_same_values(got, expected)
    assert list(modules[1].state_dict()) == list(modules[0].state_dict())


# ------------------------------------------------------------------------------------------------ 2 ranks
RANK_CASES = [("SegmentedNEMetric", {"num_groups": 3, "include_logloss": True}), ("ServingNEMetric", {}),
              ("ServingCalibrationMetric", {}), ("CaliFreeNEMetric", {}), ("NMSEMetric", {})]


def _rank_values(stream, world_size, rank, mode):
    values = {}
    for name, extra in RANK_CASES:
        metric = make("rectoolkit", name, mode, 4 * BATCH, world_size, rank, compute_on_all_ranks=True, **extra)
        values.update(feed_segments(metric, stream[rank::world_size]))
    return values


def _two_rank_worker(rank, world_size, stream, expected_by_mode):
    for mode, expected in expected_by_mode.items():
        got = _rank_values(stream, world_size, rank, mode)
        assert list(got) == list(expected)
        for key, value in expected.items():
            torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-12, equal_nan=True,
                                       msg=f"rank {rank} {mode} {key}")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_each_with_half_the_data_equal_one_process_with_all():
    from tests.distributed.dist_harness import run_workers

    # rank r gets batches r, r + 2, ...; the global window (32 samples) is the last 4 batches in one process and
    # the last 2 of each rank, so windowed and lifetime values differ and both must match
    stream = segment_stream(count=10)
    expected_by_mode = {mode: _rank_values(stream, 1, 0, mode) for mode in MODES[:2]}
    expected = expected_by_mode[MODES[0]]
    assert float(expected["segmented_ne-click|lifetime_segmented_ne_1"]) != float(
        expected["segmented_ne-click|window_segmented_ne_1"])
    assert int(expected["serving_ne-like|total_examples"]) == 10 * BATCH
    run_workers(_two_rank_worker, 2, stream, expected_by_mode)


@pytest.mark.parametrize("enum", ["MetricName", "MetricNamespace"])
@pytest.mark.parametrize("member", ["SEGMENTED_NE", "SERVING_NE", "SERVING_CALIBRATION", "CALI_FREE_NE", "UNWEIGHTED_NE",
                                    "NMSE", "NRMSE", "RECALIBRATED_NE", "RECALIBRATED_CALIBRATION"])
def test_metric_names_and_namespaces_as_torchrec(enum, member):
    theirs, ours = (getattr(importlib.import_module(f"{package}.metrics.metrics_namespace"), enum)
                    for package in ("torchrec", "rectoolkit"))
    assert hasattr(ours, member) == hasattr(theirs, member)
    if hasattr(theirs, member):
        assert getattr(ours, member).value == getattr(theirs, member).value


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", MODES[:2])
@pytest.mark.parametrize("name, extra", [("CaliFreeNEMetric", {}), ("RecalibratedNEMetric", {}), ("NMSEMetric", {}),
                                         ("ServingNEMetric", {}), ("SegmentedNEMetric", {"num_groups": 3})])
def test_local_compute_and_reset_as_torchrec(name, extra, mode):
    theirs, ours = (make(library, name, mode, 24, **extra) for library in ("torchrec", "rectoolkit"))
    stream = segment_stream(count=5)
    for metric in (theirs, ours):
        feed_segments(metric, stream)
    assert_same_values(ours.local_compute(), theirs.local_compute())
    for metric in (theirs, ours):
        metric.reset()
        feed_segments(metric, stream[:2])
    assert_same_values(ours.compute(), theirs.compute())
