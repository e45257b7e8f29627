"""RecMetricModule beyond update/compute against TorchRec 1.8 on the same batches: get_pre_compute_states /
load_pre_compute_states, sync / unsync, async_compute, shutdown, the legacy state_dict key; one process and two
gloo ranks."""

from __future__ import annotations

import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from rectoolkit.metrics import metric_module as ours_module
from rectoolkit.metrics import metrics_config as ours_config
from rectoolkit.metrics.rec_metric import RecMetricException

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec
from torchrec.metrics import metric_module as theirs_module  # noqa: E402
from torchrec.metrics import metrics_config as theirs_config  # noqa: E402

METRICS = ("CTR", "NE", "CALIBRATION", "MSE")


def module(module_lib, config_lib, mode, world_size=1, rank=0, metrics=METRICS):
    tasks = [config_lib.RecTaskInfo(name="click"),
             config_lib.RecTaskInfo(name="buy", label_name="l2", prediction_name="p2", weight_name="w2")]
    config = config_lib.MetricsConfig(
        rec_tasks=tasks, rec_compute_mode=getattr(config_lib.RecComputeMode, mode),
        rec_metrics={getattr(config_lib.RecMetricEnum, name): config_lib.RecMetricDef(rec_tasks=tasks, window_size=8)
                     for name in metrics})
    return module_lib.generate_metric_module(module_lib.RecMetricModule, config, batch_size=2, world_size=world_size,
                                             my_rank=rank, state_metrics_mapping={}, device=torch.device("cpu"))


def model_outputs(seed, count=3):
    generator = torch.Generator().manual_seed(seed)
    outputs = []
    for _ in range(count):
        out = {}
        for label, prediction, weight in (("label", "prediction", "weight"), ("l2", "p2", "w2")):
            out[prediction] = torch.rand(2, generator=generator)
            out[label] = torch.randint(0, 2, (2,), generator=generator).float()
            out[weight] = torch.rand(2, generator=generator) + 0.5
        outputs.append(out)
    return outputs


def assert_states_equal(got, expected):
    assert list(got) == list(expected)
    for namespace, per_task in expected.items():
        assert list(got[namespace]) == list(per_task), namespace
        for task, states in per_task.items():
            assert sorted(got[namespace][task]) == sorted(states), (namespace, task)
            for name, value in states.items():
                # TorchRec sums each batch in float32 (its inputs' dtype), rectoolkit in float64
                torch.testing.assert_close(got[namespace][task][name], value, rtol=1e-6, atol=1e-6,
                                           msg=f"{namespace} {task} {name}")


def assert_metrics_equal(got, expected):
    assert sorted(got) == sorted(expected)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.fixture
def one_rank_group():
    """TorchRec's get_pre_compute_states asks torch.distributed for the world size even with one process."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'rendezvous')}", rank=0,
                                world_size=1, timeout=datetime.timedelta(seconds=60))
        yield
        dist.destroy_process_group()


@pytest.mark.parametrize("metrics", [METRICS, ("MAE", "ACCURACY", "PRECISION", "RECALL", "WEIGHTED_AVG",
                                                "NE_POSITIVE")])
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_pre_compute_states_equal_torchrecs_and_load_either_way(mode, metrics, one_rank_group):
    ours = module(ours_module, ours_config, mode, metrics=metrics)
    theirs = module(theirs_module, theirs_config, mode, metrics=metrics)
    for out in model_outputs(seed=1):
        ours.update(out)
        theirs.update(out)
    assert_states_equal(ours.get_pre_compute_states(), theirs.get_pre_compute_states())

    # TorchRec's saved states, loaded into fresh modules of both libraries, compute the same metrics
    saved = theirs.get_pre_compute_states()
    fresh_ours = module(ours_module, ours_config, mode, metrics=metrics)
    fresh_theirs = module(theirs_module, theirs_config, mode, metrics=metrics)
    fresh_ours.load_pre_compute_states(saved)
    fresh_theirs.load_pre_compute_states(saved)
    assert_metrics_equal(fresh_ours.compute(), dict(fresh_theirs.compute()))
    assert_states_equal(fresh_ours.get_pre_compute_states(), saved)


def test_pre_compute_states_hand_worked():
    ours = module(ours_module, ours_config, "UNFUSED_TASKS_COMPUTATION", metrics=("CTR",))
    ours.update({"prediction": torch.tensor([0.2, 0.4]), "label": torch.tensor([0.0, 1.0]),
                 "weight": torch.tensor([1.0, 3.0]), "p2": torch.zeros(2), "l2": torch.ones(2), "w2": torch.ones(2)})
    states = ours.get_pre_compute_states()
    assert {name: value.tolist() for name, value in states["ctr"]["click"].items()} == {
        "ctr_num": [3.0], "window_ctr_num": [3.0], "ctr_denom": [4.0], "window_ctr_denom": [4.0]}
    assert states["ctr"]["buy"]["ctr_num"].tolist() == [2.0]


def test_load_pre_compute_states_names_what_is_missing():
    ours = module(ours_module, ours_config, "UNFUSED_TASKS_COMPUTATION", metrics=("CTR",))
    with pytest.raises(KeyError, match=r"no states for metric 'ctr'; the source has \['ne'\]"):
        ours.load_pre_compute_states({"ne": {}})
    with pytest.raises(KeyError, match=r"task 'click' has no state 'window_ctr_num'"):
        ours.load_pre_compute_states({"ctr": {"click": {"ctr_num": torch.ones(1), "ctr_denom": torch.ones(1)},
                                              "buy": {}}})


def test_auc_pre_compute_states_are_refused_by_name():
    ours = module(ours_module, ours_config, "UNFUSED_TASKS_COMPUTATION", metrics=("AUC",))
    with pytest.raises(NotImplementedError, match="pre-compute states of AUCMetric are not implemented"):
        ours.get_pre_compute_states()


def test_async_compute_shutdown_and_legacy_key_as_torchrec():
    ours, theirs = module(ours_module, ours_config, "UNFUSED_TASKS_COMPUTATION"), \
        module(theirs_module, theirs_config, "UNFUSED_TASKS_COMPUTATION")
    for instance in (ours, theirs):
        with pytest.raises(Exception, match="async_compute is not supported in RecMetricModule") as raised:
            instance.async_compute()
        assert type(raised.value).__name__ == "RecMetricException"
        assert instance.shutdown() is None
    assert isinstance(pytest.raises(RecMetricException, ours.async_compute).value, RecMetricException)
    state = ours.state_dict()
    ours.load_state_dict({**state, "_trained_batches": torch.tensor(3)})  # dropped, as TorchRec's hook drops it


def test_update_while_synced_is_refused_until_unsync():
    ours = module(ours_module, ours_config, "UNFUSED_TASKS_COMPUTATION", metrics=("CTR",))
    out = model_outputs(seed=2)[0]
    ours.update(out)
    ours.sync()
    with pytest.raises(RecMetricException, match="call unsync"):
        ours.update(out)
    ours.unsync()
    ours.update(out)


@pytest.mark.parametrize("metric", ["CTR", "AUC"])
def test_reset_forgets_a_sync(metric):
    ours = module(ours_module, ours_config, "UNFUSED_TASKS_COMPUTATION", metrics=(metric,))
    ours.update(model_outputs(seed=2)[0])
    ours.sync()
    ours.reset()
    ours.update(model_outputs(seed=2)[0])  # refused if the sync were kept


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_sync_and_pre_compute_states_equal_torchrecs():
    from tests.distributed.dist_harness import run_workers

    run_workers(_two_rank_worker, 2)


def _two_rank_worker(rank, world_size):
    mode = "UNFUSED_TASKS_COMPUTATION"
    ours = module(ours_module, ours_config, mode, world_size, rank)
    theirs = module(theirs_module, theirs_config, mode, world_size, rank)
    for out in model_outputs(seed=10 + rank):
        ours.update(out)
        theirs.update(out)
    local_before = ours.local_compute()
    assert_states_equal(ours.get_pre_compute_states(), theirs.get_pre_compute_states())
    ours.sync()
    theirs.sync()
    synced = ours.local_compute()  # all ranks' data now
    assert_metrics_equal(synced, dict(theirs.local_compute()))
    assert synced["ctr-click|local_lifetime_ctr"] != local_before["ctr-click|local_lifetime_ctr"]
    ours.unsync()
    theirs.unsync()
    assert_metrics_equal(ours.local_compute(), local_before)
    assert_metrics_equal(ours.local_compute(), dict(theirs.local_compute()))


def test_local_compute_keys_are_torchrecs():
    ours = module(ours_module, ours_config, "FUSED_TASKS_COMPUTATION", metrics=("CTR", "NE"))
    theirs = module(theirs_module, theirs_config, "FUSED_TASKS_COMPUTATION", metrics=("CTR", "NE"))
    for out in model_outputs(seed=3):
        ours.update(out)
        theirs.update(out)
    got, expected = ours.local_compute(), dict(theirs.local_compute())
    assert list(got) == list(expected)
    assert_metrics_equal(got, expected)
