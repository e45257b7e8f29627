"""MultiLabelPrecisionMetric, PrecisionSessionMetric and RecallSessionMetric against TorchRec 1.8's on the same
batches (keys, values, state_dict, each loading the other's), alone and through generate_metric_module, against
hand-worked numbers, and their refusals."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

from tests.metrics.torchrec_pairs import assert_same_values, feed_both, generate_both  # noqa: E402

TASKS = ["click", "like"]
BATCH = 8


def session_tasks(config, run_ranking_of_labels=False):
    return [config.RecTaskInfo(name=t, label_name=f"{t}_y", prediction_name=f"{t}_p", weight_name=f"{t}_w",
                               session_metric_def=config.SessionMetricDef(
                                   session_var_name=f"{t}_session", top_threshold=top,
                                   run_ranking_of_labels=run_ranking_of_labels))
            for t, top in zip(TASKS, (1, 2))]


def batches(kind, count=6, seed=0):
    """(predictions, labels, weights, required_inputs) per update. session: binary labels (or graded, ranked with
    run_ranking_of_labels) and session ids in 3 sessions; multi_label: 3-bit encoded predictions and labels."""
    generator = torch.Generator().manual_seed(seed)
    stream = []
    for _ in range(count):
        if kind == "multi_label":
            predictions = {t: torch.randint(0, 8, (BATCH,), generator=generator).float() for t in TASKS}
            labels = {t: torch.randint(0, 8, (BATCH,), generator=generator).float() for t in TASKS}
        else:
            predictions = {t: torch.rand(BATCH, generator=generator) for t in TASKS}
            labels = {t: torch.randint(0, 2, (BATCH,), generator=generator).float() for t in TASKS}
        weights = {t: torch.rand(BATCH, generator=generator) * 2 for t in TASKS}
        required = {f"{t}_session": torch.randint(0, 3, (BATCH,), generator=generator) for t in TASKS}
        stream.append((predictions, labels, weights, required))
    return stream


def make(library, module, cls_name, mode="UNFUSED_TASKS_COMPUTATION", window_size=2 * BATCH, ranking=False,
         world_size=1, rank=0, **kwargs):
    cls = getattr(importlib.import_module(f"{library}.metrics.{module}"), cls_name)
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    tasks = session_tasks(config, ranking) if "session" in module else [config.RecTaskInfo(name=t) for t in TASKS]
    return cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=tasks,
               compute_mode=getattr(config.RecComputeMode, mode),
               window_size=window_size, **kwargs)


def feed(metric, stream, session=True):
    for predictions, labels, weights, required in stream:
        extra = {"required_inputs": required} if session else {}
        metric.update(predictions=predictions, labels=labels, weights=weights, **extra)
    return metric.compute()


CASES = [("recall_session", "RecallSessionMetric", "UNFUSED_TASKS_COMPUTATION", False, {}),
         ("recall_session", "RecallSessionMetric", "UNFUSED_TASKS_COMPUTATION", True, {}),
         ("precision_session", "PrecisionSessionMetric", "UNFUSED_TASKS_COMPUTATION", False, {}),
         ("precision_session", "PrecisionSessionMetric", "UNFUSED_TASKS_COMPUTATION", True, {}),
         ("multi_label_precision", "MultiLabelPrecisionMetric", "UNFUSED_TASKS_COMPUTATION", False,
          {"num_labels": 3, "label_names": ["cat", "dog", "horse"]}),
         ("multi_label_precision", "MultiLabelPrecisionMetric", "FUSED_TASKS_COMPUTATION", False, {"num_labels": 3}),
         ("multi_label_precision", "MultiLabelPrecisionMetric", "UNFUSED_TASKS_COMPUTATION", False, {})]


@pytest.mark.torchrec
@pytest.mark.parametrize("window_size", [2 * BATCH, 10_000])
@pytest.mark.parametrize("module, cls_name, mode, ranking, extra", CASES)
def test_same_keys_values_and_state_dict_as_torchrec(module, cls_name, mode, ranking, extra, window_size):
    theirs = make("torchrec", module, cls_name, mode, window_size, ranking, **extra)
    ours = make("rectoolkit", module, cls_name, mode, window_size, ranking, **extra)
    if "session" in module:
        assert ours.get_required_inputs() == theirs.get_required_inputs() == {"click_session", "like_session"}
    stream = batches("multi_label" if module == "multi_label_precision" else "session")
    expected, got = feed(theirs, stream), feed(ours, stream)
    assert_same_values(got, expected)
    if window_size == 2 * BATCH:
        lifetime = [value for key, value in got.items() if "lifetime" in key]
        window = [value for key, value in got.items() if "window" in key]
        assert any(not torch.equal(a, b) for a, b in zip(lifetime, window))
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        assert our_state[key].dtype == value.dtype and our_state[key].shape == value.shape, key
        torch.testing.assert_close(our_state[key], value, rtol=1e-6, atol=1e-9, msg=key)
    resumed_ours = make("rectoolkit", module, cls_name, mode, window_size, ranking, **extra)
    resumed_theirs = make("torchrec", module, cls_name, mode, window_size, ranking, **extra)
    resumed_ours.load_state_dict(their_state)
    resumed_theirs.load_state_dict(our_state)
    later = batches("multi_label" if module == "multi_label_precision" else "session", count=2, seed=5)
    assert_same_values(feed(resumed_ours, later), feed(resumed_theirs, later))


@pytest.mark.torchrec
def test_generate_metric_module_builds_them_as_torchrec():
    def config(package):
        metrics = {getattr(package.RecMetricEnum, member): package.RecMetricDef(rec_task_indices=[0, 1], window_size=16)
                   for member in ("PRECISION_SESSION_LEVEL", "RECALL_SESSION_LEVEL")}
        return package.MetricsConfig(rec_tasks=session_tasks(package), rec_metrics=metrics)

    modules = generate_both(config, BATCH)
    assert sorted(modules[1].get_required_inputs()) == sorted(modules[0].get_required_inputs())
    expected, got = feed_both(modules, batches("session"), TASKS)
    assert_same_values(got, expected)
    assert len(got) == 8


def test_hand_worked_values():
    from rectoolkit.metrics.metrics_config import RecTaskInfo, SessionMetricDef
    from rectoolkit.metrics.multi_label_precision import MultiLabelPrecisionMetric
    from rectoolkit.metrics.recall_session import RecallSessionMetric

    # bits (cat, dog): predicted 3 = both, 1 = cat, 2 = dog; labelled 1 = cat, 1 = cat, 3 = both
    metric = MultiLabelPrecisionMetric(world_size=1, my_rank=0, batch_size=3, tasks=[RecTaskInfo(name="t")],
                                       num_labels=2, label_names=["cat", "dog"])
    metric.update(predictions={"t": torch.tensor([3.0, 1.0, 2.0])}, labels={"t": torch.tensor([1.0, 1.0, 3.0])},
                  weights={"t": torch.tensor([1.0, 2.0, 4.0])})
    values = {key.split("|")[1]: float(value) for key, value in metric.compute().items()}
    assert values["lifetime_multi_label_precisioncat"] == 1.0  # samples 0 and 1 predicted cat, both are
    assert values["lifetime_multi_label_precisiondog"] == pytest.approx(4 / 5)  # samples 0 (w 1, no) and 2 (w 4, yes)
    # session 7: predictions 0.1 < 0.4 < 0.8, top 2 are samples 1 and 2; positives are samples 0 and 2 (weights 3, 1)
    task = RecTaskInfo(name="t", session_metric_def=SessionMetricDef(session_var_name="s", top_threshold=2))
    recall = RecallSessionMetric(world_size=1, my_rank=0, batch_size=3, tasks=[task])
    recall.update(predictions={"t": torch.tensor([0.1, 0.8, 0.4])}, labels={"t": torch.tensor([1.0, 0.0, 1.0])},
                  weights={"t": torch.tensor([3.0, 2.0, 1.0])}, required_inputs={"s": torch.tensor([7, 7, 7])})
    assert float(recall.compute()["recall_session_level-t|lifetime_recall_session_level"]) == pytest.approx(1 / 4)


def test_refusals():
    from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo, SessionMetricDef
    from rectoolkit.metrics.multi_label_precision import MultiLabelPrecisionMetric
    from rectoolkit.metrics.precision_session import PrecisionSessionMetric
    from rectoolkit.metrics.rec_metric import RecMetricException

    defined = RecTaskInfo(name="t", session_metric_def=SessionMetricDef(session_var_name="s", top_threshold=1))
    with pytest.raises(RecMetricException, match="Fused computation is not supported"):
        PrecisionSessionMetric(world_size=1, my_rank=0, batch_size=2, tasks=[defined],
                               compute_mode=RecComputeMode.FUSED_TASKS_COMPUTATION)
    with pytest.raises(RecMetricException, match="specify the session metric definition"):
        PrecisionSessionMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    with pytest.raises(RecMetricException, match="specify the top threshold"):
        PrecisionSessionMetric(world_size=1, my_rank=0, batch_size=2, tasks=[
            RecTaskInfo(name="t", session_metric_def=SessionMetricDef(session_var_name="s"))])
    metric = PrecisionSessionMetric(world_size=1, my_rank=0, batch_size=2, tasks=[defined])
    with pytest.raises(RecMetricException, match="Need the s input"):
        metric.update(predictions={"t": torch.rand(2)}, labels={"t": torch.ones(2)}, weights=None)
    with pytest.raises(ValueError, match="2 label_names"):
        MultiLabelPrecisionMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")], num_labels=3,
                                  label_names=["a", "b"])


# ------------------------------------------------------------------------------------------------ 2 ranks
RANK_CASES = [case for case in CASES if case[2] == "UNFUSED_TASKS_COMPUTATION"]


def _rank_metrics(world_size=1, rank=0):
    return [make("rectoolkit", module, cls_name, mode, 10_000, ranking, world_size, rank, compute_on_all_ranks=True,
                 **extra) for module, cls_name, mode, ranking, extra in RANK_CASES]


def _streams(seed):
    return [batches("multi_label" if case[0] == "multi_label_precision" else "session", count=6, seed=seed)
            for case in RANK_CASES]


def _two_rank_worker(rank, world_size, expected):
    for metric, stream, values in zip(_rank_metrics(world_size, rank), _streams(4), expected):
        got = feed(metric, stream[rank::world_size])
        assert list(got) == list(values)
        for key, value in values.items():
            torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-12, equal_nan=True, msg=f"rank {rank} {key}")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_each_with_half_the_data_equal_one_process_with_all():
    from tests.distributed.dist_harness import run_workers

    # the window holds everything (10_000 samples), so lifetime and window both equal one process's
    expected = [feed(metric, stream) for metric, stream in zip(_rank_metrics(), _streams(4))]
    run_workers(_two_rank_worker, 2, expected)
