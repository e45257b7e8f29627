"""TowerQPSMetric against TorchRec 1.8's on the same steps of a fake clock (keys, values, state_dict), alone and
through generate_metric_module, against hand-worked rates, and over 2 gloo ranks (examples summed, time the slowest
rank's)."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

TASKS = ["click", "like"]
BATCH = 4
# seconds each step takes: irregular, so the window (3 batches) drops steps
STEP_SECONDS = [0.5, 1.0, 0.25, 2.0, 1.5, 0.75, 3.0, 0.5]


class FakeClock:
    """time.monotonic for both libraries: the same instants, advanced by the test."""

    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr("time.monotonic", lambda: self.now)


def make(library, mode, warmup_steps, **kwargs):
    cls = importlib.import_module(f"{library}.metrics.tower_qps").TowerQPSMetric
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    return cls(world_size=1, my_rank=0, batch_size=BATCH, tasks=[config.RecTaskInfo(name=t) for t in TASKS],
               compute_mode=getattr(config.RecComputeMode, mode), window_size=3 * BATCH, warmup_steps=warmup_steps,
               **kwargs)


def labels_of(step):
    return {t: torch.full((BATCH,), float(step % 2)) for t in TASKS}


def assert_same_values(got, expected):
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        torch.testing.assert_close(got[key], value, rtol=1e-12, atol=0, msg=key)


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION",
                                  "FUSED_TASKS_AND_STATES_COMPUTATION"])
@pytest.mark.parametrize("warmup_steps", [0, 2])
def test_keys_values_and_state_dict_equal_torchrecs(monkeypatch, mode, warmup_steps):
    clock = FakeClock(monkeypatch)
    theirs, ours = make("torchrec", mode, warmup_steps), make("rectoolkit", mode, warmup_steps)
    for step, seconds in enumerate(STEP_SECONDS):
        clock.now += seconds
        for metric in (theirs, ours):
            metric.update(predictions=None, labels=labels_of(step), weights=None)
        assert_same_values(ours.compute(), theirs.compute())
    values = ours.compute()
    assert float(values["qps-click|window_qps"].sum()) != float(values["qps-click|lifetime_qps"].sum())
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        assert our_state[key].dtype == value.dtype
        torch.testing.assert_close(our_state[key], value, rtol=0, atol=0, msg=key)
    resumed_ours, resumed_theirs = make("rectoolkit", mode, warmup_steps), make("torchrec", mode, warmup_steps)
    resumed_ours.load_state_dict(their_state)
    resumed_theirs.load_state_dict(our_state)
    for step, seconds in enumerate(STEP_SECONDS[:4]):
        clock.now += seconds
        for metric in (resumed_theirs, resumed_ours):
            metric.update(predictions=None, labels=labels_of(step), weights=None)
        assert_same_values(resumed_ours.compute(), resumed_theirs.compute())


@pytest.mark.torchrec
def test_generate_metric_module_builds_it_as_torchrec(monkeypatch):
    clock = FakeClock(monkeypatch)
    modules = []
    for library in ("torchrec", "rectoolkit"):
        package = importlib.import_module(f"{library}.metrics.metrics_config")
        generate = importlib.import_module(f"{library}.metrics.metric_module")
        tasks = [package.RecTaskInfo(name=t, label_name=f"{t}_y", prediction_name=f"{t}_p", weight_name=f"{t}_w")
                 for t in TASKS]
        config = package.MetricsConfig(rec_tasks=tasks, rec_metrics={package.RecMetricEnum.TOWER_QPS: package.RecMetricDef(
            rec_task_indices=[0, 1], window_size=3 * BATCH, arguments={"warmup_steps": 1})})
        modules.append(generate.generate_metric_module(generate.RecMetricModule, config, batch_size=BATCH, world_size=1,
                                                       my_rank=0, state_metrics_mapping={},
                                                       device=torch.device("cpu")))
    for step, seconds in enumerate(STEP_SECONDS):
        clock.now += seconds
        model_out = {f"{t}_{suffix}": torch.rand(BATCH) for t in TASKS for suffix in "ypw"}
        for module in modules:
            module.update(model_out)
    expected, got = (dict(module.compute()) for module in modules)
    assert_same_values(got, expected)
    assert len(got) == 6
    assert list(modules[1].state_dict()) == list(modules[0].state_dict())


def test_hand_worked_rates(monkeypatch):
    from rectoolkit.metrics.metrics_config import RecTaskInfo
    from rectoolkit.metrics.tower_qps import TowerQPSMetric

    clock = FakeClock(monkeypatch)
    metric = TowerQPSMetric(world_size=1, my_rank=0, batch_size=5, tasks=[RecTaskInfo(name="t")], window_size=10,
                            warmup_steps=1)
    for seconds, size in ((0.0, 5), (1.0, 5), (2.0, 3), (4.0, 5)):  # the warm-up step, then 1 s, 2 s and 4 s
        clock.now += seconds
        metric.update(predictions=None, labels={"t": torch.zeros(size)}, weights=None)
    values = {key: float(value) for key, value in metric.compute().items()}
    assert values["qps-t|total_examples"] == 18
    assert values["qps-t|lifetime_qps"] == pytest.approx(13 / 7)
    assert values["qps-t|window_qps"] == pytest.approx(8 / 6)  # the window (10 examples) keeps the last 2 steps


def test_refusals():
    from rectoolkit.metrics.metrics_config import RecTaskInfo
    from rectoolkit.metrics.rec_metric import RecMetricException
    from rectoolkit.metrics.tower_qps import TowerQPSMetric

    task = [RecTaskInfo(name="t")]
    with pytest.raises(RecMetricException, match="Fused update is not supported for tower QPS"):
        TowerQPSMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, fused_update_limit=2)
    with pytest.raises(NotImplementedError, match="batch_size_stages"):
        TowerQPSMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, batch_size_stages=[object()])
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        TowerQPSMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, warmup_steps=-1)


# ------------------------------------------------------------------------------------------------ 2 ranks
# rank r's step times and batch sizes: rank 1 is slower and has fewer examples
RANK_STEPS = {0: [(1.0, 4), (2.0, 4), (1.0, 4)], 1: [(1.0, 2), (3.0, 3), (2.0, 1)]}


def _two_rank_worker(rank, world_size):
    import time

    from rectoolkit.metrics.metrics_config import RecTaskInfo
    from rectoolkit.metrics.tower_qps import TowerQPSMetric

    now = [50.0]
    time.monotonic = lambda: now[0]  # this worker's own clock
    metric = TowerQPSMetric(world_size=world_size, my_rank=rank, batch_size=4, tasks=[RecTaskInfo(name="t")],
                            window_size=8, warmup_steps=1, compute_on_all_ranks=True)
    for seconds, size in RANK_STEPS[rank]:
        now[0] += seconds
        metric.update(predictions=None, labels={"t": torch.zeros(size)}, weights=None)
    values = {key: float(value) for key, value in metric.compute().items()}
    # after the warm-up: rank 0 trains 8 examples in 3 s, rank 1 4 examples in 5 s; all ranks' examples over the
    # slowest rank's time
    assert values["qps-t|lifetime_qps"] == pytest.approx((8 + 4) / 5), (rank, values)
    assert values["qps-t|total_examples"] == 12 + 6, (rank, values)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_sum_examples_over_the_slowest_time():
    from tests.distributed.dist_harness import run_workers

    run_workers(_two_rank_worker, 2)
