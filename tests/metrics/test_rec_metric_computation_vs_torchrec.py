"""A custom metric written as TorchRec's docs write one (a RecMetricComputation subclass and a RecMetric naming it)
runs unchanged on rectoolkit's classes and gives TorchRec's keys, values and state_dict."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

BATCH, TASKS = 4, ["click", "like"]


def _library(name):
    """(RecMetric, RecMetricComputation, MetricComputationReport, RecTaskInfo, RecComputeMode, MetricName,
    MetricNamespace, MetricPrefix) of one library, from TorchRec's module paths."""
    rec_metric = importlib.import_module(f"{name}.metrics.rec_metric")
    config = importlib.import_module(f"{name}.metrics.metrics_config")
    namespace = importlib.import_module(f"{name}.metrics.metrics_namespace")
    return (rec_metric.RecMetric, rec_metric.RecMetricComputation, rec_metric.MetricComputationReport,
            config.RecTaskInfo, config.RecComputeMode, namespace.MetricName, namespace.MetricNamespace,
            namespace.MetricPrefix)


def _custom_metric_class(name):
    """The same user code, against one library: weighted label sum (lifetime and window, summed over ranks), the
    largest prediction (max over ranks), a scale given to the metric, and a required input."""
    (RecMetric, RecMetricComputation, MetricComputationReport, _, _, MetricName, MetricNamespace,
     MetricPrefix) = _library(name)

    class ScaledSumComputation(RecMetricComputation):
        def __init__(self, *args, scale: float = 1.0, **kwargs):
            super().__init__(*args, **kwargs)
            self._scale = scale
            self._add_state("label_sum", torch.zeros(self._n_tasks, dtype=torch.double), add_window_state=True,
                            dist_reduce_fx="sum", persistent=True)
            self._add_state("largest", torch.full((self._n_tasks,), -1.0, dtype=torch.double),
                            add_window_state=False, dist_reduce_fx="max", persistent=True)

        def update(self, *, predictions, labels, weights, **kwargs):
            num_samples = predictions.shape[-1]
            bonus = kwargs["required_inputs"]["bonus"] if "required_inputs" in kwargs else 0
            batch_sum = torch.sum((labels + bonus) * weights, dim=-1).double() * self._scale
            self.label_sum += batch_sum
            self._aggregate_window_state("label_sum", batch_sum, num_samples)
            self.largest = torch.maximum(self.largest, predictions.max(dim=-1).values.double())

        def _compute(self):
            return [
                MetricComputationReport(name=MetricName.CTR, metric_prefix=MetricPrefix.LIFETIME, value=self.label_sum),
                MetricComputationReport(name=MetricName.CTR, metric_prefix=MetricPrefix.WINDOW,
                                        value=self.get_window_state("label_sum")),
                MetricComputationReport(name=MetricName.MAE, metric_prefix=MetricPrefix.LIFETIME, value=self.largest,
                                        description="_max"),
            ]

    class ScaledSumMetric(RecMetric):
        _namespace = MetricNamespace.CTR
        _computation_class = ScaledSumComputation

        def _get_task_required_inputs(self, task_config):
            return {"bonus"}

    return ScaledSumMetric


def _build(name, mode, **kwargs):
    task_info, compute_mode = _library(name)[3], _library(name)[4]
    return _custom_metric_class(name)(world_size=kwargs.pop("world_size", 1), my_rank=kwargs.pop("my_rank", 0),
                                      batch_size=BATCH, tasks=[task_info(name=t) for t in TASKS],
                                      compute_mode=getattr(compute_mode, mode), window_size=2 * BATCH, **kwargs)


def _batches(count, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [({t: torch.rand(BATCH, generator=generator) for t in TASKS},
             {t: (torch.rand(BATCH, generator=generator) > 0.5).float() for t in TASKS},
             {t: torch.rand(BATCH, generator=generator) for t in TASKS}) for _ in range(count)]


def _feed(metric, batches, bonus=None):
    for predictions, labels, weights in batches:
        extra = {"required_inputs": {"bonus": bonus}} if bonus is not None else {}
        metric.update(predictions=predictions, labels=labels, weights=weights, **extra)


@pytest.mark.torchrec
@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("bonus", [None, torch.tensor([0.5])])
def test_a_custom_metric_gives_torchrecs_keys_values_and_state(mode, bonus):
    ours, theirs = _build("rectoolkit", mode, scale=2.0), _build("torchrec", mode, scale=2.0)
    assert ours.get_required_inputs() == theirs._required_inputs == {"bonus"}
    for metric in (ours, theirs):
        _feed(metric, _batches(5), bonus)
    for method in ("compute", "local_compute"):
        mine, reference = getattr(ours, method)(), getattr(theirs, method)()
        assert list(mine) == list(reference)
        for key in reference:
            torch.testing.assert_close(mine[key], reference[key], rtol=0, atol=0, msg=key)
    mine_state, their_state = ours.state_dict(), theirs.state_dict()
    assert list(mine_state) == list(their_state)
    for key in their_state:
        torch.testing.assert_close(mine_state[key], their_state[key], rtol=0, atol=0, msg=key)
    # each resumes from the other's state_dict: the lifetime states carry on, the window starts empty
    ours.reset()
    ours.load_state_dict(their_state)
    assert float(ours.compute()["ctr-click|window_ctr"].sum()) == 0.0
    torch.testing.assert_close(ours.compute()["ctr-click|lifetime_ctr"], theirs.compute()["ctr-click|lifetime_ctr"])


def test_the_computation_refuses_an_argument_it_does_not_take_and_a_bad_reduction():
    with pytest.raises(TypeError, match=r"unexpected arguments \['colour'\]"):
        _build("rectoolkit", "UNFUSED_TASKS_COMPUTATION", colour="red")
    from rectoolkit.metrics.rec_metric import RecMetricComputation

    class Bad(RecMetricComputation):
        def update(self, **kwargs):
            pass

        def _compute(self):
            return []

    computation = Bad(my_rank=0, batch_size=1, n_tasks=1, window_size=1)
    with pytest.raises(ValueError, match=r"state 's' has dist_reduce_fx='median'"):
        computation._add_state("s", torch.zeros(1), add_window_state=False, dist_reduce_fx="median")
    with pytest.raises(KeyError, match=r"'s2' has no window state"):
        computation._add_state("s2", torch.zeros(1), add_window_state=False)
        computation._aggregate_window_state("s2", torch.ones(1), 1)


def _two_rank_worker(rank, world_size, stream, expected):
    metric = _build("rectoolkit", "FUSED_TASKS_COMPUTATION", world_size=world_size, my_rank=rank,
                    compute_on_all_ranks=True, scale=2.0)
    _feed(metric, stream[rank::world_size])
    got = metric.compute()
    assert sorted(got) == sorted(expected)
    for key in expected:
        if "window" not in key:  # the window: the last batches of each rank, not the last of the stream
            torch.testing.assert_close(got[key], expected[key], rtol=1e-12, atol=0, msg=key)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_custom_metrics_states_are_reduced_over_ranks_by_their_dist_reduce_fx():
    from tests.distributed.dist_harness import run_workers

    stream = _batches(6, seed=4)
    single = _build("rectoolkit", "FUSED_TASKS_COMPUTATION", scale=2.0)
    _feed(single, stream)
    run_workers(_two_rank_worker, 2, stream, single.compute())
