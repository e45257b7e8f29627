"""GAUCMetric and NDCGMetric against TorchRec 1.8's on the same batches (keys, lifetime and window values after
every step, local_compute, reset, state_dict, fused and unfused, NDCG's options), through RecMetricModule
(generate_metric_module for NDCG; a RecMetricList for GAUC, which TorchRec's RecMetricEnum lacks), against
hand-worked values, and with the required inputs missing or wrong."""

import importlib
import math

import pytest
import torch

from rectoolkit.metrics import (GAUCMetric, MetricsConfig, NDCGMetric, NEMetric, RecComputeMode, RecMetricDef,
                                RecMetricEnum, RecMetricList, RecMetricModule, RecTaskInfo, generate_metric_module)
from rectoolkit.metrics.rec_metric import MissingRequiredInputError, RecMetricException
from tests.metrics.test_more_metrics_vs_torchrec import BATCH, TASKS, batches

WINDOW = 20  # smaller than the stream: the window drops whole batches
NDCG_OPTIONS = [{}, {"k": 2, "exponential_gain": True},
                {"remove_single_length_sessions": True, "report_ndcg_as_decreasing_curve": False},
                {"scale_by_weights_tensor": True, "session_key": "query_id"}]


def session_batches(count, seed=0, ties=False):
    """batches() with sessions: `num_candidates` (GAUC: consecutive sessions of random sizes, 0 included) and
    session ids (NDCG: 3 random ids per batch, interleaved, some sessions of one sample)."""
    generator = torch.Generator().manual_seed(2000 + seed)
    stream = []
    for predictions, labels, weights in batches(count=count, seed=seed, ties=ties):
        cuts = torch.sort(torch.randint(0, BATCH + 1, (3,), generator=generator)).values
        num_candidates = torch.diff(torch.cat([torch.tensor([0]), cuts, torch.tensor([BATCH])]))
        session_ids = 10 * torch.randint(0, 3, (BATCH,), generator=generator) + 7
        stream.append((predictions, labels, weights, num_candidates, session_ids))
    return stream


def make(library, class_name, mode, window_size=WINDOW, **extra):
    """`class_name` of {library}.metrics (gauc or ndcg) over TASKS, "like" a negative task."""
    package = importlib.import_module(f"{library}.metrics.{class_name[:-6].lower()}")
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    return getattr(package, class_name)(
        world_size=1, my_rank=0, batch_size=BATCH, window_size=window_size,
        tasks=[config.RecTaskInfo(name=t, is_negative_task=t == "like") for t in TASKS],
        compute_mode=getattr(config.RecComputeMode, mode), **extra)


def feed(metric, batch, mode, session_key="session_id"):
    """One update of GAUC (num_candidates=) or NDCG (required_inputs=, TorchRec's [n_tasks, batch] when fused),
    on copies: TorchRec's unfused NDCG flips a negative task's inputs in place."""
    predictions, labels, weights, num_candidates, session_ids = batch
    copy = {"predictions": {t: v.clone() for t, v in predictions.items()},
            "labels": {t: v.clone() for t, v in labels.items()}, "weights": weights}
    if type(metric).__name__ == "GAUCMetric":
        metric.update(**copy, num_candidates=num_candidates)
    else:
        ids = session_ids if mode == "UNFUSED_TASKS_COMPUTATION" else session_ids.expand(len(TASKS), -1)
        metric.update(**copy, required_inputs={session_key: ids})


def assert_same_values(got, expected):
    assert list(got) == list(expected)  # the same keys in TorchRec's order
    for key, value in expected.items():
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key  # [1] unfused, 0-d fused
        # TorchRec's GAUC sums float32 products, its NDCG discounts in float32; rectoolkit in float64
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, equal_nan=True, msg=key)


def assert_same_state(got, expected):
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-7, msg=key)


def run_side_by_side(class_name, mode, ties, **extra):
    """Both libraries fed the same stream, compared after every step; returns both, fed."""
    theirs, ours = make("torchrec", class_name, mode, **extra), make("rectoolkit", class_name, mode, **extra)
    for step, batch in enumerate(session_batches(count=8, ties=ties)):
        for metric in (theirs, ours):
            feed(metric, batch, mode, extra.get("session_key", "session_id"))
        assert_same_values(ours.compute(), theirs.compute())
        if step == 2:
            assert_same_values(ours.local_compute(), theirs.local_compute())
        if step == 3:
            theirs.reset()
            ours.reset()
    return theirs, ours


@pytest.mark.torchrec
@pytest.mark.parametrize("ties", [False, True])  # with ties: tied predictions inside sessions, labels 0, 1/2, 1
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_gauc_equals_torchrecs_after_every_step(mode, ties):
    pytest.importorskip("torchrec")
    theirs, ours = run_side_by_side("GAUCMetric", mode, ties)
    values = ours.compute()
    assert float(values["gauc-click|lifetime_gauc_num_samples"]) > float(values["gauc-click|window_gauc_num_samples"])
    assert_same_state(ours.state_dict(), theirs.state_dict())
    assert list(ours.state_dict()) == ["_metrics_computations.0.auc_sum", "_metrics_computations.0.num_samples"] + (
        ["_metrics_computations.1.auc_sum", "_metrics_computations.1.num_samples"]
        if mode == "UNFUSED_TASKS_COMPUTATION" else [])
    # each resumes from the other's state: the lifetime carries on, the window starts empty
    resumed_ours, resumed_theirs = make("rectoolkit", "GAUCMetric", mode), make("torchrec", "GAUCMetric", mode)
    resumed_ours.load_state_dict(theirs.state_dict())
    resumed_theirs.load_state_dict(ours.state_dict())
    for batch in session_batches(count=2, seed=5, ties=ties):
        feed(resumed_ours, batch, mode)
        feed(resumed_theirs, batch, mode)
    assert_same_values(resumed_ours.compute(), resumed_theirs.compute())


@pytest.mark.torchrec
@pytest.mark.parametrize("options", NDCG_OPTIONS, ids=lambda options: ",".join(options) or "defaults")
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_ndcg_equals_torchrecs_after_every_step(mode, ties, options):
    pytest.importorskip("torchrec")
    theirs, ours = run_side_by_side("NDCGMetric", mode, ties, **options)
    assert ours.get_required_inputs() == theirs.get_required_inputs() == {options.get("session_key", "session_id")}
    values = ours.compute()
    assert not torch.equal(values["ndcg-click|lifetime_ndcg"], values["ndcg-click|window_ndcg"])
    assert_same_state(ours.state_dict(), theirs.state_dict())


def test_ndcg_takes_session_ids_of_one_row_in_the_fused_modes_too():
    # TorchRec's fused NDCG asserts ids of [n_tasks, batch] (what RecMetricModule passes, [batch], fails there)
    stream = session_batches(count=3, seed=1)
    fused = make("rectoolkit", "NDCGMetric", "FUSED_TASKS_COMPUTATION")
    unfused = make("rectoolkit", "NDCGMetric", "UNFUSED_TASKS_COMPUTATION")
    for predictions, labels, weights, _, session_ids in stream:
        for metric in (fused, unfused):
            metric.update(predictions=predictions, labels=labels, weights=weights,
                          required_inputs={"session_id": session_ids})
    expected = unfused.compute()
    assert {key: float(value) for key, value in fused.compute().items()} == pytest.approx(
        {key: float(value) for key, value in expected.items()}, rel=1e-12)


def _ndcg_config(package, mode, session_key=None):
    tasks = [package.RecTaskInfo(name=t, label_name=f"y_{t}", prediction_name=f"p_{t}", weight_name=f"w_{t}",
                                 is_negative_task=t == "like") for t in TASKS]
    ndcg = package.RecMetricDef(rec_task_indices=[0, 1], window_size=WINDOW,
                                arguments={"session_key": session_key} if session_key else None)
    ne = package.RecMetricDef(rec_task_indices=[0, 1], window_size=WINDOW)
    # NE first: TorchRec's unfused NDCG flips a negative task's labels in the model output, in place
    return package.MetricsConfig(rec_tasks=tasks, rec_compute_mode=getattr(package.RecComputeMode, mode),
                                 rec_metrics={package.RecMetricEnum.NE: ne, package.RecMetricEnum.NDCG: ndcg})


def _model_out(batch, session_key="session_id"):
    predictions, labels, weights, num_candidates, session_ids = batch
    out = {f"{kind}_{t}": source[t].clone() for t in TASKS
           for kind, source in (("p", predictions), ("y", labels), ("w", weights))}
    return {**out, session_key: session_ids.view(-1, 1)}  # [batch, 1], as a model returns it: squeezed


@pytest.mark.torchrec
@pytest.mark.parametrize("session_key", [None, "query_id"])
def test_generate_metric_module_feeds_ndcg_its_required_input_as_torchrec(session_key):
    pytest.importorskip("torchrec")
    from torchrec.metrics import metric_module as theirs_module
    from torchrec.metrics import metrics_config as theirs_config

    from rectoolkit.metrics import metrics_config as ours_config

    modules = [library.generate_metric_module(library.RecMetricModule,
                                              _ndcg_config(package, "UNFUSED_TASKS_COMPUTATION", session_key),
                                              batch_size=BATCH, world_size=1, my_rank=0, state_metrics_mapping={},
                                              device=torch.device("cpu"))
               for library, package in ((theirs_module, theirs_config),
                                        (importlib.import_module("rectoolkit.metrics.metric_module"), ours_config))]
    theirs, ours = modules
    assert ours.get_required_inputs() == theirs.get_required_inputs() == [session_key or "session_id"]
    for batch in session_batches(count=5, seed=2):
        for module in modules:
            module.update(_model_out(batch, session_key or "session_id"))
    expected, got = dict(theirs.compute()), dict(ours.compute())
    assert sorted(got) == sorted(expected) and len(got) == 8  # NE and NDCG, 2 tasks, lifetime and window
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)
    assert_same_state(ours.state_dict(), theirs.state_dict())
    # TorchRec's fused NDCG fails on the [batch] ids the module passes; rectoolkit's gives the unfused numbers
    fused = generate_metric_module(RecMetricModule, _ndcg_config(ours_config, "FUSED_TASKS_COMPUTATION", session_key),
                                   batch_size=BATCH, world_size=1, my_rank=0, state_metrics_mapping={},
                                   device=torch.device("cpu"))
    for batch in session_batches(count=5, seed=2):
        fused.update(_model_out(batch, session_key or "session_id"))
    assert {key: float(value) for key, value in fused.compute().items()} == pytest.approx(
        {key: float(value) for key, value in expected.items()}, rel=1e-6)


@pytest.mark.torchrec
def test_rec_metric_module_passes_gauc_its_num_candidates_as_torchrec():
    pytest.importorskip("torchrec")
    modules = []
    for library in ("torchrec", "rectoolkit"):
        metric_module = importlib.import_module(f"{library}.metrics.metric_module")
        config = importlib.import_module(f"{library}.metrics.metrics_config")
        metrics = [make(library, "GAUCMetric", "UNFUSED_TASKS_COMPUTATION"),
                   importlib.import_module(f"{library}.metrics.ne").NEMetric(
                       world_size=1, my_rank=0, batch_size=BATCH, tasks=[config.RecTaskInfo(name="click")])]
        modules.append(metric_module.RecMetricModule(
            batch_size=BATCH, world_size=1, rec_metrics=metric_module.RecMetricList(metrics),
            rec_tasks=[config.RecTaskInfo(name=t, label_name=f"y_{t}", prediction_name=f"p_{t}",
                                          weight_name=f"w_{t}") for t in TASKS]))
    theirs, ours = modules
    assert ours.get_required_inputs() is None and theirs.get_required_inputs() is None  # a keyword, not an output
    for batch in session_batches(count=6, seed=3, ties=True):
        for module in modules:  # NE takes the keyword too, and ignores it
            module.update(_model_out(batch), num_candidates=batch[3])
    expected, got = dict(theirs.compute()), dict(ours.compute())
    assert list(got) == list(expected) and len(got) == 8 + 2
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)
    assert_same_state(ours.state_dict(), theirs.state_dict())


@pytest.mark.torchrec
def test_listed_session_names_become_session_ids_as_torchrec():
    pytest.importorskip("torchrec")
    from torchrec.metrics.model_utils import session_ids_to_tensor as theirs

    from rectoolkit.metrics.ndcg import session_ids_to_tensor as ours

    names = ["q1", "q1", "q7", "q7", "q7", "q1", "q2", "q2"]
    assert ours(names).tolist() == theirs(names).tolist() == [1, 1, 2, 2, 2, 3, 4, 4]
    task = RecTaskInfo(name="ndcg_click")  # TorchRec converts a list only for a task named "ndcg..."
    module = generate_metric_module(RecMetricModule, MetricsConfig(rec_tasks=[task], rec_metrics={
        RecMetricEnum.NDCG: RecMetricDef(rec_task_indices=[0], window_size=BATCH)}), batch_size=BATCH, world_size=1,
        my_rank=0, state_metrics_mapping={}, device=torch.device("cpu"))
    predictions, labels, weights, _, _ = session_batches(count=1)[0]
    module.update({"prediction": predictions["click"], "label": labels["click"], "weight": weights["click"],
                   "session_id": names})
    direct = NDCGMetric(world_size=1, my_rank=0, batch_size=BATCH, tasks=[task], window_size=BATCH)
    direct.update(predictions={"ndcg_click": predictions["click"]}, labels={"ndcg_click": labels["click"]},
                  weights={"ndcg_click": weights["click"]}, required_inputs={"session_id": theirs(names)})
    assert {key: float(value) for key, value in module.compute().items()} == {
        key: float(value) for key, value in direct.compute().items()}


def feed_session_metrics(stream, world_size=1, rank=0):
    """GAUC and NDCG (rectoolkit's, window 4 batches over all ranks) fed (predictions, labels, weights) batches
    with the same sessions in each; their compute() on every rank. test_more_metrics_vs_torchrec's 2-rank worker
    checks them across ranks with its other metrics."""
    num_candidates = torch.tensor([3, 0, 5])
    session_ids = torch.tensor([5, 5, 1, 1, 1, 9, 9, 5])
    values = {}
    for cls in (GAUCMetric, NDCGMetric):
        metric = cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=[RecTaskInfo(name=t) for t in TASKS],
                     window_size=4 * BATCH, compute_on_all_ranks=True)
        for predictions, labels, weights in stream:
            metric.update(predictions=predictions, labels=labels, weights=weights, num_candidates=num_candidates,
                          required_inputs={"session_id": session_ids})
        values.update(metric.compute())
    return values


# ------------------------------------------------------------------------------------------------ by hand
def _one_task(cls, batch_size, **extra):
    return cls(world_size=1, my_rank=0, batch_size=batch_size, tasks=[RecTaskInfo(name="t")],
               window_size=batch_size, **extra)


def test_gauc_hand_worked():
    gauc = _one_task(GAUCMetric, 7)
    # session A, from the lowest prediction: 0.3 (+, w 2) 0.3 (-, w 3, after it in the batch) 0.5 (+, w 1)
    # 0.7 (-, w 1): positives above negatives: w 1 over w 3 only (the tie counts 0 in TorchRec's order), so
    # 3 / (3 x 4); session B: all predictions equal, C: one sample: neither counts
    gauc.update(predictions={"t": torch.tensor([0.3, 0.7, 0.3, 0.5, 0.6, 0.6, 0.2])},
                labels={"t": torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])},
                weights={"t": torch.tensor([2.0, 1.0, 3.0, 1.0, 1.0, 1.0, 1.0])}, num_candidates=torch.tensor([4, 2, 1]))
    first = {key: float(value) for key, value in gauc.compute().items()}
    assert first == {"gauc-t|lifetime_gauc": pytest.approx(0.25), "gauc-t|window_gauc": pytest.approx(0.25),
                     "gauc-t|lifetime_gauc_num_samples": 1.0, "gauc-t|window_gauc_num_samples": 1.0}
    # D: both positives below the negative (AUC 0); E: a prediction of 0 next to others counts, AUC 1
    gauc.update(predictions={"t": torch.tensor([0.9, 0.1, 0.4, 0.2, 0.8, 0.0, 0.5])},
                labels={"t": torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0])}, weights=None,
                num_candidates=torch.tensor([3, 4]))
    second = {key: float(value) for key, value in gauc.compute().items()}
    assert second["gauc-t|window_gauc"] == pytest.approx(1 / 2)  # the window holds the second batch only
    assert second["gauc-t|lifetime_gauc"] == pytest.approx(1.25 / 3)
    assert second["gauc-t|lifetime_gauc_num_samples"] == 3.0
    # TorchRec's skip: predictions all equal to the first one or 0 (0 read as padding) -> no session: 0.5
    skipped = _one_task(GAUCMetric, 2)
    skipped.update(predictions={"t": torch.tensor([0.5, 0.0])}, labels={"t": torch.tensor([1.0, 0.0])}, weights=None,
                   num_candidates=torch.tensor([2]))
    assert [float(v) for v in skipped.compute().values()] == [pytest.approx(0.5), pytest.approx(0.5), 0.0, 0.0]


def test_ndcg_hand_worked():
    predictions = {"t": torch.tensor([0.2, 0.9, 0.5, 0.4, 0.6, 0.3])}
    labels = {"t": torch.tensor([1.0, 0.0, 2.0, 1.0, 0.0, 0.0])}
    weights = {"t": torch.tensor([1.0, 2.0, 1.0, 0.5, 0.5, 1.0])}
    ids = {"session_id": torch.tensor([7, 7, 7, 3, 3, 5])}

    def ndcg(**extra):
        metric = _one_task(NDCGMetric, 6, **extra)
        metric.update(predictions=predictions, labels=labels, weights=weights, required_inputs=ids)
        return float(metric.compute()["ndcg-t|lifetime_ndcg"])

    # session 7 by prediction: labels 0, 2, 1; ideal 2, 1, 0; its largest weight 2
    seven = (2 / math.log2(3) + 1 / 2) / (2 + 1 / math.log2(3))
    # session 3 by prediction: labels 0, 1; weight 0.5. Session 5: one sample labelled 0: DCG 0 of ideal 0 (1e-6)
    three = (1 / math.log2(3)) / 1
    assert ndcg() == pytest.approx(((1 - seven) * 2 + (1 - three) * 0.5 + 1 * 1) / 3)
    assert ndcg(remove_single_length_sessions=True) == pytest.approx(((1 - seven) * 2 + (1 - three) * 0.5) / 2)
    assert ndcg(report_ndcg_as_decreasing_curve=False) == pytest.approx((seven * 2 + three * 0.5) / 3)
    assert ndcg(k=1) == pytest.approx((1 * 2 + 1 * 0.5 + 1) / 3)  # each session's top sample is labelled 0
    exponential = (3 / math.log2(3) + 1 / 2) / (3 + 1 / math.log2(3))  # gains 2^label - 1
    assert ndcg(exponential_gain=True) == pytest.approx(((1 - exponential) * 2 + (1 - three) * 0.5 + 1) / 3)
    # weights scale labels and predictions, not the session's value: session 7 scores 0.2, 1.8, 0.5 for labels
    # 1, 0, 2 and session 3 scores 0.2, 0.3 for 0.5, 0: each NDCG as before
    assert ndcg(scale_by_weights_tensor=True) == pytest.approx(((1 - seven) + (1 - three) + 1) / 3)


# ------------------------------------------------------------------------------------------------ bad inputs
def test_missing_or_wrong_required_inputs_are_refused_by_name():
    predictions, labels, weights, num_candidates, session_ids = session_batches(count=1)[0]
    batch = {"predictions": predictions, "labels": labels, "weights": weights}
    gauc = make("rectoolkit", "GAUCMetric", "UNFUSED_TASKS_COMPUTATION")
    with pytest.raises(MissingRequiredInputError, match="num_candidates is missing") as missing:
        gauc.update(**batch)
    assert isinstance(missing.value, KeyError) and isinstance(missing.value, RecMetricException)
    with pytest.raises(ValueError, match=r"num_candidates \(2 sessions\) sums to 7 but task 'click' has 8 samples"):
        gauc.update(**batch, num_candidates=torch.tensor([3, 4]))
    with pytest.raises(ValueError, match=r"must be session sizes, integers >= 0"):
        gauc.update(**batch, num_candidates=torch.tensor([4.0, 4.0]))
    with pytest.raises(ValueError, match=r"num_candidates=\[9, -1\] must be session sizes"):
        gauc.update(**batch, num_candidates=torch.tensor([9, -1]))
    ndcg = make("rectoolkit", "NDCGMetric", "FUSED_TASKS_COMPUTATION", session_key="query_id")
    with pytest.raises(MissingRequiredInputError, match=r"required_inputs has no 'query_id' \(it has \['session_id'\]"):
        ndcg.update(**batch, required_inputs={"session_id": session_ids})
    with pytest.raises(ValueError, match=r"has shape \(7,\) but task 'click' has 8 samples"):
        ndcg.update(**batch, required_inputs={"query_id": session_ids[:7]})
    with pytest.raises(ValueError, match=r"has shape \(2, 8\) .*with equal rows"):
        ndcg.update(**batch, required_inputs={"query_id": torch.stack([session_ids, session_ids + 1])})
    with pytest.raises(TypeError, match=r"unexpected keywords \['num_candidate'\]"):  # misspelt: not ignored
        gauc.update(**batch, num_candidate=torch.tensor([4, 4]))
    with pytest.raises(TypeError, match=r"unexpected keywords \['required_input'\]"):
        RecMetricList([ndcg]).update(**batch, required_input={"query_id": session_ids})
    for k in (0, -2, 1.5):
        with pytest.raises(ValueError, match=rf"k={k} must be a positive int"):
            make("rectoolkit", "NDCGMetric", "FUSED_TASKS_COMPUTATION", k=k)
    with pytest.raises(ValueError, match="unknown or unimplemented argument top_k=3"):
        make("rectoolkit", "NDCGMetric", "FUSED_TASKS_COMPUTATION", top_k=3)
    assert gauc.compute()["gauc-click|lifetime_gauc_num_samples"].tolist() == [0.0]  # nothing got in


def test_rec_metric_module_names_a_required_input_the_model_output_lacks():
    module = generate_metric_module(RecMetricModule, _ndcg_config(importlib.import_module(
        "rectoolkit.metrics.metrics_config"), "UNFUSED_TASKS_COMPUTATION"), batch_size=BATCH, world_size=1, my_rank=0,
        state_metrics_mapping={}, device=torch.device("cpu"))
    model_out = _model_out(session_batches(count=1)[0])
    del model_out["session_id"]
    with pytest.raises(KeyError, match=r"the metrics read 'session_id' from the model output .* add 'session_id'"):
        module.update(model_out)
    task = RecTaskInfo(name="click", label_name="y_click", prediction_name="p_click", weight_name="w_click")
    gauc_and_ne = [make("rectoolkit", "GAUCMetric", "UNFUSED_TASKS_COMPUTATION"),
                   NEMetric(world_size=1, my_rank=0, batch_size=BATCH, tasks=[task])]
    gauc_only = RecMetricModule(batch_size=BATCH, world_size=1, rec_tasks=[task], rec_metrics=RecMetricList(gauc_and_ne))
    with pytest.raises(MissingRequiredInputError, match=r"module.update\(model_out, num_candidates=...\)"):
        gauc_only.update(model_out)


def test_fused_gauc_reads_one_num_candidates_for_all_tasks():
    stream = session_batches(count=4, seed=4, ties=True)
    fused = make("rectoolkit", "GAUCMetric", "FUSED_TASKS_AND_STATES_COMPUTATION")
    unfused = make("rectoolkit", "GAUCMetric", "UNFUSED_TASKS_COMPUTATION")
    for predictions, labels, weights, num_candidates, _ in stream:
        stacked = [torch.stack([source[t] for t in TASKS]) for source in (predictions, labels, weights)]
        fused.update(predictions=stacked[0], labels=stacked[1], weights=stacked[2], num_candidates=num_candidates)
        unfused.update(predictions=predictions, labels=labels, weights=weights, num_candidates=num_candidates)
    assert fused._compute_mode == RecComputeMode.FUSED_TASKS_AND_STATES_COMPUTATION
    expected = {key: float(value) for key, value in unfused.compute().items()}
    assert {key: float(value) for key, value in fused.compute().items()} == pytest.approx(expected, rel=1e-12)
