"""RecMetricModule.get_pre_compute_states / load_pre_compute_states for metrics written as TorchRec's computations
(tower QPS under a mocked clock, counting and averaging metrics) against TorchRec 1.8's, in one process."""

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

from tests.metrics.test_metric_module_vs_torchrec import one_rank_group  # noqa: E402,F401  (the fixture)
from tests.metrics.torchrec_pairs import assert_same_values, generate_both  # noqa: E402

TASKS = ["click", "like"]
BATCH = 4
MEMBERS = ("TOWER_QPS", "NUM_POSITIVE_SAMPLES", "AVERAGE", "XAUC", "SUM_WEIGHTS")


def config_for(mode):
    def config(package):
        tasks = [package.RecTaskInfo(name=t, label_name=f"{t}_y", prediction_name=f"{t}_p", weight_name=f"{t}_w")
                 for t in TASKS]
        metrics = {getattr(package.RecMetricEnum, member): package.RecMetricDef(
            rec_task_indices=[0, 1], window_size=2 * BATCH, arguments={"warmup_steps": 1} if member == "TOWER_QPS" else None)
            for member in MEMBERS}
        return package.MetricsConfig(rec_tasks=tasks, rec_metrics=metrics,
                                     rec_compute_mode=getattr(package.RecComputeMode, mode))
    return config


def feed(modules, clock, seed):
    generator = torch.Generator().manual_seed(seed)
    for seconds in (0.5, 1.0, 2.0, 0.25):
        clock[0] += seconds
        model_out = {f"{t}_{suffix}": torch.rand(BATCH, generator=generator) for t in TASKS for suffix in "pw"}
        model_out.update({f"{t}_y": torch.randint(0, 2, (BATCH,), generator=generator).float() for t in TASKS})
        for module in modules:
            module.update(model_out)


def assert_states_equal(got, expected):
    assert list(got) == list(expected)
    for namespace, per_task in expected.items():
        assert list(got[namespace]) == list(per_task), namespace
        for task, states in per_task.items():
            assert list(got[namespace][task]) == list(states), (namespace, task)
            for name, value in states.items():
                assert got[namespace][task][name].dtype == value.dtype, (namespace, task, name)
                torch.testing.assert_close(got[namespace][task][name], value, rtol=1e-6, atol=1e-9,
                                           msg=f"{namespace} {task} {name}")


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_pre_compute_states_equal_torchrecs_and_load_either_way(monkeypatch, mode, one_rank_group):  # noqa: F811
    clock = [100.0]
    monkeypatch.setattr("time.monotonic", lambda: clock[0])
    theirs, ours = generate_both(config_for(mode), BATCH)
    feed((theirs, ours), clock, seed=0)
    saved = theirs.get_pre_compute_states()
    assert_states_equal(ours.get_pre_compute_states(), saved)
    assert set(saved) == {"qps", "num_positive_samples", "average", "xauc", "sum_weights"}
    # TorchRec's saved states, loaded into fresh modules of both libraries, compute the same metrics
    fresh_theirs, fresh_ours = generate_both(config_for(mode), BATCH)
    fresh_ours.load_pre_compute_states(saved)
    fresh_theirs.load_pre_compute_states(saved)
    assert_same_values(dict(fresh_ours.compute()), dict(fresh_theirs.compute()))
    feed((fresh_theirs, fresh_ours), clock, seed=1)
    assert_same_values(dict(fresh_ours.compute()), dict(fresh_theirs.compute()))


def test_load_names_what_is_missing():
    from rectoolkit.metrics import metric_module, metrics_config

    task = metrics_config.RecTaskInfo(name="click")
    config = metrics_config.MetricsConfig(rec_tasks=[task], rec_metrics={
        metrics_config.RecMetricEnum.SUM_WEIGHTS: metrics_config.RecMetricDef(rec_tasks=[task], window_size=8)})
    module = metric_module.generate_metric_module(metric_module.RecMetricModule, config, batch_size=2, world_size=1,
                                                  my_rank=0, state_metrics_mapping={}, device=torch.device("cpu"))
    with pytest.raises(KeyError, match=r"no states for metric 'sum_weights'; the source has \['ne'\]"):
        module.load_pre_compute_states({"ne": {}})
    with pytest.raises(KeyError, match=r"has no states for task 'click'"):
        module.load_pre_compute_states({"sum_weights": {"like": {}}})
