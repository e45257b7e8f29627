"""AUPRCMetric against TorchRec 1.8's on the same batches (window and lifetime values after every step, through
local_compute and reset), against hand-worked areas, and across 2 gloo ranks."""

import importlib

import pytest
import torch

from rectoolkit.metrics import AUPRCMetric, MetricsConfig, RecComputeMode, RecMetricDef, RecMetricEnum, RecTaskInfo
from rectoolkit.metrics.auprc import weighted_auprc
from tests.metrics.test_more_metrics_vs_torchrec import BATCH, TASKS, batches

WINDOW = 20  # smaller than the stream: the window drops whole batches and cuts one mid-way


def make(library, mode, window_size=WINDOW, world_size=1, rank=0, *, module="auprc", class_name="AUPRCMetric",
         **extra):
    """The metric `class_name` of torchrec.metrics.{module} or rectoolkit's, over TASKS."""
    package = importlib.import_module(f"{library}.metrics.{module}")
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    return getattr(package, class_name)(world_size=world_size, my_rank=rank, batch_size=BATCH,
                                        tasks=[config.RecTaskInfo(name=t) for t in TASKS],
                                        compute_mode=getattr(config.RecComputeMode, mode), window_size=window_size,
                                        **extra)


def assert_same_values(got, expected):
    assert list(got) == list(expected)  # window before lifetime, in TorchRec's task order
    for key, value in expected.items():
        assert got[key].shape == value.shape, key
        # TorchRec computes the window AUPRC in float32, rectoolkit in float64
        torch.testing.assert_close(got[key], value, rtol=2e-6, atol=2e-6, check_dtype=False, msg=key)


@pytest.mark.torchrec
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_values_after_every_step_equal_torchrecs(mode, ties):
    pytest.importorskip("torchrec")
    theirs, ours = make("torchrec", mode), make("rectoolkit", mode)
    stream = batches(count=9, ties=ties)
    for step, (predictions, labels, weights) in enumerate(stream):
        for metric in (theirs, ours):
            metric.update(predictions=predictions, labels=labels, weights=weights)
        assert_same_values(ours.compute(), theirs.compute())
        if step % 3 == 1:  # local_compute folds the window into the lifetime average too, in both
            assert_same_values(ours.local_compute(), theirs.local_compute())
        if step == 5:  # reset empties the window and keeps the lifetime average, in both
            theirs.reset()
            ours.reset()
            assert_same_values(ours.compute(), theirs.compute())
    values = ours.compute()
    assert not torch.equal(values["auprc-click|window_auprc"].double(), values["auprc-click|lifetime_auprc"])
    assert list(ours.state_dict()) == list(theirs.state_dict()) == []


def generated_modules(enum_name, stream):
    """TorchRec's and rectoolkit's generate_metric_module for one metric over TASKS, fed the same model outputs."""
    from torchrec.metrics import metric_module as theirs_module
    from torchrec.metrics import metrics_config as theirs_config

    from rectoolkit.metrics import metric_module as ours_module
    from rectoolkit.metrics import metrics_config as ours_config

    modules = []
    for library, package in ((theirs_module, theirs_config), (ours_module, ours_config)):
        tasks = [package.RecTaskInfo(name=t, label_name=f"y_{t}", prediction_name=f"p_{t}", weight_name=f"w_{t}")
                 for t in TASKS]
        config = package.MetricsConfig(rec_tasks=tasks, rec_metrics={
            getattr(package.RecMetricEnum, enum_name): package.RecMetricDef(rec_task_indices=[0, 1],
                                                                            window_size=WINDOW)})
        modules.append(library.generate_metric_module(library.RecMetricModule, config, batch_size=BATCH,
                                                      world_size=1, my_rank=0, state_metrics_mapping={},
                                                      device=torch.device("cpu")))
    for predictions, labels, weights in stream:
        out = {f"{kind}_{t}": source[t] for t in TASKS
               for kind, source in (("p", predictions), ("y", labels), ("w", weights))}
        for module in modules:
            module.update(out)
    return modules


@pytest.mark.torchrec
def test_generate_metric_module_builds_it_as_torchrec():
    pytest.importorskip("torchrec")
    theirs, ours = generated_modules("AUPRC", batches(count=5))
    assert_same_values(dict(ours.compute()), dict(theirs.compute()))


def test_hand_worked_areas():
    # from the highest prediction: 0.9 (+, w 2) 0.7 (-, w 1) 0.4 (+, w 1 and -, w 1: one step) 0.2 (-, w 3)
    predictions = torch.tensor([0.9, 0.7, 0.4, 0.4, 0.2])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    weights = torch.tensor([2.0, 1.0, 1.0, 1.0, 3.0])
    # recall 2/3 at precision 1, then recall 1 at precision 3/5
    assert float(weighted_auprc(predictions, labels, weights)) == pytest.approx(2 / 3 + 1 / 3 * 3 / 5)
    assert float(weighted_auprc(predictions, torch.zeros(5), weights)) == 0.0  # no positive: 0, as TorchRec
    assert float(weighted_auprc(torch.zeros(0), torch.zeros(0), torch.zeros(0))) == 0.0
    # fused lifetime: the window AUPRCs of both tasks averaged, weighted by the window's weight
    metric = AUPRCMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name=t) for t in TASKS],
                         compute_mode=RecComputeMode.FUSED_TASKS_COMPUTATION, window_size=2)
    metric.update(predictions=torch.tensor([[0.9, 0.1], [0.2, 0.8]]), labels=torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
                  weights=None)
    first = metric.compute()  # click 1, like 1/2 (the positive ranks second: recall 1 at precision 1/2)
    assert [float(first[f"auprc-{t}|window_auprc"]) for t in TASKS] == [1.0, 0.5]
    assert float(first["auprc-like|lifetime_auprc"]) == pytest.approx(0.75)
    metric.update(predictions=torch.tensor([[0.9, 0.1], [0.9, 0.1]]), labels=torch.tensor([[1.0, 0.0], [1.0, 0.0]]),
                  weights=torch.tensor([[3.0, 3.0], [3.0, 3.0]]))
    # second window: both 1, total weight 12; first window: total weight 4: (1.5 * 4 + 2 * 12) / (2 * 16)
    assert float(metric.compute()["auprc-click|lifetime_auprc"]) == pytest.approx((1.5 * 4 + 2 * 12) / 32)


def test_grouped_auprc_and_bad_inputs_are_refused_by_name():
    task = [RecTaskInfo(name="t")]
    AUPRCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, grouped_auprc=False)
    with pytest.raises(NotImplementedError, match="grouped_auprc=True is not implemented"):
        AUPRCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, grouped_auprc=True)
    with pytest.raises(ValueError, match="unknown or unimplemented argument threshold=0.5"):
        AUPRCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task, threshold=0.5)
    metric = AUPRCMetric(world_size=1, my_rank=0, batch_size=2, tasks=task)
    with pytest.raises(ValueError, match="task 't' has 2 predictions but 3 labels"):
        metric.update(predictions={"t": torch.rand(2)}, labels={"t": torch.ones(3)}, weights=None)
    config = MetricsConfig(rec_tasks=task, rec_metrics={RecMetricEnum.AUPRC: RecMetricDef(rec_task_indices=[0])})
    assert config.rec_metrics[RecMetricEnum.AUPRC].window_size == 10_000_000


# ------------------------------------------------------------------------------------------------ 2 ranks
def _two_rank_worker(rank, world_size, stream, expected):
    metric = make("rectoolkit", "FUSED_TASKS_COMPUTATION", 4 * BATCH, world_size, rank, compute_on_all_ranks=True)
    for step, (predictions, labels, weights) in enumerate(stream[rank::world_size]):
        metric.update(predictions=predictions, labels=labels, weights=weights)
        got = metric.compute()
        assert list(got) == list(expected[step])
        for key, value in expected[step].items():
            torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-12, msg=f"rank {rank} step {step} {key}")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_each_with_half_the_data_equal_one_process_with_all():
    from tests.distributed.dist_harness import run_workers

    stream = batches(count=10, seed=3)
    # rank r gets batches r, r + 2, ...; computed after each round, one process's window (32 samples: the last 4
    # batches) is the union of the ranks' (the last 2 of each), so window and lifetime values both match
    single = make("rectoolkit", "FUSED_TASKS_COMPUTATION", 4 * BATCH)
    expected = []
    for step, (predictions, labels, weights) in enumerate(stream):
        single.update(predictions=predictions, labels=labels, weights=weights)
        if step % 2 == 1:
            expected.append(single.compute())
    assert float(expected[-1]["auprc-click|window_auprc"]) != float(expected[-1]["auprc-click|lifetime_auprc"])
    run_workers(_two_rank_worker, 2, stream, expected)
