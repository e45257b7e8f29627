"""ThroughputMetric against TorchRec 1.8's on the same steps of a fake clock (keys, values, state_dict), alone
and inside RecMetricModule, and against hand-worked rates. It communicates nothing (every rank counts the same
steps), so there is no multi-rank test."""

import pytest
import torch

from rectoolkit.metrics import MetricsConfig, RecMetricModule, generate_metric_module
from rectoolkit.metrics.metrics_config import ThroughputDef
from rectoolkit.metrics.throughput import MAX_WINDOW_TS, ThroughputMetric

# seconds each step takes: irregular, so the 5-second window drops steps
STEP_SECONDS = [0.5, 1.0, 0.25, 2.0, 1.5, 0.75, 3.0, 0.5, 1.25, 2.25]


class FakeClock:
    """time.monotonic for both libraries: the same instants, advanced by the test."""

    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr("time.monotonic", lambda: self.now)


def assert_same_values(got, expected):
    assert list(got) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], torch.as_tensor(value), rtol=1e-12, atol=0, msg=key)


def step_both(clock, metrics, seconds):
    clock.now += seconds
    for metric in metrics:
        metric.update()


@pytest.mark.torchrec
@pytest.mark.parametrize("warmup_steps", [1, 3])
def test_keys_values_and_state_dict_equal_torchrecs(monkeypatch, warmup_steps):
    from torchrec.metrics.throughput import ThroughputMetric as Theirs

    clock = FakeClock(monkeypatch)
    arguments = dict(batch_size=16, world_size=4, window_seconds=5, warmup_steps=warmup_steps)
    theirs, ours = Theirs(**arguments), ThroughputMetric(**arguments)
    assert_same_values(ours.compute(), theirs.compute())
    for seconds in STEP_SECONDS:
        step_both(clock, (theirs, ours), seconds)
        assert_same_values(ours.compute(), theirs.compute())
    values = ours.compute()
    assert float(values["throughput-throughput|window_throughput"]) != float(
        values["throughput-throughput|lifetime_throughput"])
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state) == ["total_examples", "warmup_examples", "time_lapse_after_warmup"]
    for key, value in their_state.items():
        torch.testing.assert_close(our_state[key], value, rtol=0, atol=0, msg=key)
    assert [name for name, _ in ours.named_buffers()] == [name for name, _ in theirs.named_buffers()]
    # each resumes from the other's state: lifetime carries on, attempt and window start again
    resumed_ours, resumed_theirs = ThroughputMetric(**arguments), Theirs(**arguments)
    resumed_ours.load_state_dict(their_state)
    resumed_theirs.load_state_dict(our_state)
    for seconds in STEP_SECONDS[:5]:
        step_both(clock, (resumed_theirs, resumed_ours), seconds)
        assert_same_values(resumed_ours.compute(), resumed_theirs.compute())


@pytest.mark.torchrec
def test_rec_metric_module_with_throughput_equals_torchrecs(monkeypatch):
    from torchrec.metrics import metric_module as theirs_module
    from torchrec.metrics import metrics_config as theirs_config

    from rectoolkit.metrics import metric_module as ours_module
    from rectoolkit.metrics import metrics_config as ours_config

    clock = FakeClock(monkeypatch)
    modules = []
    for library, package in ((theirs_module, theirs_config), (ours_module, ours_config)):
        task = package.RecTaskInfo(name="click")
        config = package.MetricsConfig(
            rec_tasks=[task], rec_metrics={package.RecMetricEnum.CTR: package.RecMetricDef(rec_tasks=[task],
                                                                                           window_size=8)},
            throughput_metric=package.ThroughputDef(window_size=3, warmup_steps=2))
        modules.append(library.generate_metric_module(library.RecMetricModule, config, batch_size=2, world_size=1,
                                                      my_rank=0, state_metrics_mapping={},
                                                      device=torch.device("cpu")))
    generator = torch.Generator().manual_seed(0)
    for seconds in STEP_SECONDS:
        out = {"prediction": torch.rand(2, generator=generator), "label": torch.tensor([0.0, 1.0]),
               "weight": torch.ones(2)}
        clock.now += seconds
        for module in modules:
            module.update(out)
    expected, got = dict(modules[0].compute()), dict(modules[1].compute())
    assert_same_values(got, expected)
    assert "throughput-throughput|window_throughput" in got
    assert list(modules[1].state_dict()) == list(modules[0].state_dict())


def test_hand_worked_rates(monkeypatch):
    clock = FakeClock(monkeypatch)
    metric = ThroughputMetric(batch_size=10, world_size=2, window_seconds=2, warmup_steps=1)
    for seconds in (0.0, 1.0, 2.0):  # the warm-up step at t, then steps taking 1 s and 2 s
        clock.now += seconds
        metric.update()
    values = metric.compute()
    assert int(values["throughput-throughput|total_examples"]) == 60
    assert float(values["throughput-throughput|lifetime_throughput"]) == pytest.approx(40 / 3)
    # the 2-second window holds the last step only: 20 examples in 2 s
    assert float(values["throughput-throughput|window_throughput"]) == pytest.approx(10.0)
    assert float(values["throughput-throughput|attempt_throughput"]) == pytest.approx(40 / 3)


def test_pre_compute_states_hold_the_throughput_buffers(monkeypatch):
    clock = FakeClock(monkeypatch)
    config = MetricsConfig(throughput_metric=ThroughputDef(window_size=10, warmup_steps=1))
    module = generate_metric_module(RecMetricModule, config, batch_size=4, world_size=2, my_rank=0,
                                    state_metrics_mapping={}, device=torch.device("cpu"))
    for _ in range(3):
        clock.now += 1.0
        module.update({})
    states = module.get_pre_compute_states()
    saved = states["throughput"]["throughput"]
    assert int(saved["total_examples"]) == 24 and float(saved["time_lapse_after_warmup"]) == 2.0
    fresh = generate_metric_module(RecMetricModule, config, batch_size=4, world_size=2, my_rank=0,
                                   state_metrics_mapping={}, device=torch.device("cpu"))
    fresh.load_pre_compute_states(states)
    assert int(fresh.throughput_metric.total_examples) == 24
    assert float(fresh.throughput_metric.time_lapse_after_warmup) == 2.0


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="window_seconds=0 must be at least 1"):
        ThroughputMetric(batch_size=2, world_size=1, window_seconds=0)
    with pytest.raises(ValueError, match="warmup_steps=0 must be at least 1"):
        ThroughputMetric(batch_size=2, world_size=1, window_seconds=5, warmup_steps=0)
    with pytest.raises(NotImplementedError, match="batch_size_stages=.* is not implemented"):
        ThroughputMetric(batch_size=2, world_size=1, window_seconds=5, batch_size_stages=[object()])
    with pytest.raises(TypeError, match="throughput_metric='fast' is not a ThroughputMetric"):
        RecMetricModule(batch_size=2, world_size=1, throughput_metric="fast")
    capped = ThroughputMetric(batch_size=2, world_size=1, window_seconds=MAX_WINDOW_TS + 1)
    assert capped._window_seconds == MAX_WINDOW_TS  # as TorchRec: capped, with a warning
