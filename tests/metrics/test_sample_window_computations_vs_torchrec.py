"""AUCMetricComputation, RAUCMetricComputation and AUPRCMetricComputation (the window's samples as TorchRec's lists)
and rauc's functions against TorchRec 1.8 on the same inputs: the list states after every update (windows cut
mid-batch), the reports, reset, a RecMetric written the TorchRec way with them, fused and unfused, and 2 gloo ranks."""

import importlib
import random

import pytest
import torch

from tests.metrics.torchrec_pairs import user_metrics

torchrec = pytest.importorskip("torchrec")

LIBRARIES = ("torchrec", "rectoolkit")
N_TASKS, BATCH = 2, 4
COMPUTATIONS = [("auc", "AUCMetricComputation", {}), ("auc", "AUCMetricComputation", {"apply_bin": True}),
                ("rauc", "RAUCMetricComputation", {}), ("auprc", "AUPRCMetricComputation", {})]
IDS = [f"{name}{kwargs or ''}" for _, name, kwargs in COMPUTATIONS]


def _class(library, module, name):
    return getattr(importlib.import_module(f"{library}.metrics.{module}"), name)


def _batches(seed, count=5, n_tasks=N_TASKS, fractional=False):
    """Continuous predictions (no ties: TorchRec's AUC orders ties by sort order), 0/1 or fractional labels."""
    generator = torch.Generator().manual_seed(seed)
    return [(torch.rand(n_tasks, BATCH, generator=generator),
             torch.rand(n_tasks, BATCH, generator=generator) if fractional
             else (torch.rand(n_tasks, BATCH, generator=generator) > 0.5).float(),
             torch.rand(n_tasks, BATCH, generator=generator)) for _ in range(count)]


def _assert_same_lists(got, expected):
    for name in ("predictions", "labels", "weights"):
        theirs, ours = getattr(expected, name), getattr(got, name)
        assert len(ours) == len(theirs), name
        for mine, their in zip(ours, theirs):
            assert mine.dtype == their.dtype and mine.shape == their.shape, name
            torch.testing.assert_close(mine, their, rtol=0, atol=0)


def _assert_same_reports(got, expected):
    assert [(str(r.name), str(r.metric_prefix)) for r in got] == [(str(r.name), str(r.metric_prefix)) for r in expected]
    for mine, their in zip(got, expected):
        assert mine.value.dtype == their.value.dtype and mine.value.shape == their.value.shape
        torch.testing.assert_close(mine.value, their.value, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("window", [6, 10, 40])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("module, name, kwargs", COMPUTATIONS, ids=IDS)
def test_states_and_reports_equal_torchrec(module, name, kwargs, seed, window):
    built = [_class(library, module, name)(my_rank=0, batch_size=BATCH, n_tasks=N_TASKS, window_size=window,
                                           **kwargs) for library in LIBRARIES]
    expected, got = built
    _assert_same_lists(got, expected)
    for predictions, labels, weights in _batches(seed, fractional=bool(kwargs)):
        for computation in built:
            computation.update(predictions=predictions, labels=labels, weights=weights)
        _assert_same_lists(got, expected)
        _assert_same_reports(got.compute(), expected.compute())
        _assert_same_lists(got, expected)  # compute() leaves the lists as they were
    for computation in built:
        computation.reset()
    _assert_same_lists(got, expected)


@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("module, name, kwargs", COMPUTATIONS, ids=IDS)
def test_rec_metric_with_the_computation_equals_torchrec(module, name, kwargs, mode):
    tasks = ["click", "like"]
    metrics = user_metrics(module, name, "AUC", tasks, mode, batch_size=BATCH, window_size=10, **kwargs)
    for predictions, labels, weights in _batches(7):
        batch = [{t: tensor[i] for i, t in enumerate(tasks)} for tensor in (predictions, labels, weights)]
        for metric in metrics:
            metric.update(predictions=batch[0], labels=batch[1], weights=batch[2])
        expected, got = (metric.compute() for metric in metrics)
        assert list(got) == list(expected)
        for key, value in expected.items():
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-6, msg=key)


@pytest.mark.parametrize("module, name, option", [("auc", "AUCMetricComputation", "grouped_auc"),
                                                  ("rauc", "RAUCMetricComputation", "grouped_rauc"),
                                                  ("auprc", "AUPRCMetricComputation", "grouped_auprc")])
def test_grouped_variants_refused_by_name(module, name, option):
    with pytest.raises(NotImplementedError, match=f"{name}: {option}=True .* is not implemented"):
        _class("rectoolkit", module, name)(my_rank=0, batch_size=BATCH, n_tasks=1, window_size=8, **{option: True})


def _pair(name):
    return [_class(library, "rauc", name) for library in LIBRARIES]


@pytest.mark.parametrize("seed", range(6))
def test_inversion_helpers_equal_torchrecs(seed):
    """The merge-sort helpers on lists with ties, unsorted halves included: counts and the lists left behind."""
    rng = random.Random(seed)
    values = [float(rng.randint(0, 5)) for _ in range(rng.randint(2, 13))]
    (their_count, our_count), (their_divide, our_divide), (their_merge, our_merge) = (
        _pair("count_reverse_pairs_divide_and_conquer"), _pair("divide"), _pair("conquer_and_count"))
    theirs, ours = list(values), list(values)
    assert our_count(ours) == their_count(theirs) and ours == theirs
    low, high = sorted(rng.sample(range(len(values)), 2))
    theirs, ours = list(values), list(values)
    assert our_divide(ours, low, high) == their_divide(theirs, low, high) and ours == theirs
    mid = rng.randint(low, high)
    theirs, ours = list(values), list(values)
    assert our_merge(ours, low, mid, high) == their_merge(theirs, low, mid, high) and ours == theirs


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_compute_rauc_and_per_group(seed, parts):
    generator = torch.Generator().manual_seed(seed)
    samples = [(torch.rand(N_TASKS, 5, generator=generator), torch.randint(0, 4, (N_TASKS, 5), generator=generator)
                .float(), torch.rand(N_TASKS, 5, generator=generator)) for _ in range(parts)]
    predictions, labels, weights = ([sample[i] for sample in samples] for i in range(3))
    (theirs, ours) = _pair("compute_rauc")
    _assert_same_reports_values(ours(N_TASKS, predictions, labels, weights),
                                theirs(N_TASKS, predictions, labels, weights))
    keys = torch.cat([torch.tensor([-1]), torch.randint(0, 2, (5 * parts,), generator=generator)])
    keys[1:3], keys[3:5] = 0, 1  # each group has at least 2 samples
    (theirs, ours) = _pair("compute_rauc_per_group")
    _assert_same_reports_values(ours(N_TASKS, predictions, labels, weights, keys),
                                theirs(N_TASKS, predictions, labels, weights, keys))


def _assert_same_reports_values(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------ 2 ranks
def _two_rank_worker(rank, world_size):
    """Both libraries' computations on the same gloo group, each rank with its own batches (rank 1 with more, so
    the gathered windows differ in size): the same reports on every rank, and the local lists kept."""
    for module, name, kwargs in COMPUTATIONS:
        built = [_class(library, module, name)(my_rank=rank, batch_size=BATCH, n_tasks=N_TASKS, window_size=10,
                                               compute_on_all_ranks=True, **kwargs) for library in LIBRARIES]
        stream = _batches(seed=20 + rank, count=3 + rank, fractional=bool(kwargs))
        for step, (predictions, labels, weights) in enumerate(stream):
            for computation in built:
                computation.update(predictions=predictions, labels=labels, weights=weights)
            if step >= rank:  # compute() is a collective: both ranks call it as many times
                _assert_same_reports(built[1].compute(), built[0].compute())
                _assert_same_lists(built[1], built[0])


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_gather_the_windows_as_torchrec():
    from tests.distributed.dist_harness import run_workers

    run_workers(_two_rank_worker, 2)


@pytest.mark.parametrize("module, metric, computation", [("auc", "AUCMetric", "AUCMetricComputation"),
                                                         ("rauc", "RAUCMetric", "RAUCMetricComputation"),
                                                         ("auprc", "AUPRCMetric", "AUPRCMetricComputation")])
def test_subclass_of_the_metric_with_its_own_computation_equals_torchrec(module, metric, computation):
    """`class MyAUC(AUCMetric): _computation_class = MyAUCComputation`: run, reset and run again by the computation."""
    metrics = []
    for library in LIBRARIES:
        config = importlib.import_module(f"{library}.metrics.metrics_config")

        class Squared(_class(library, module, computation)):  # the user's change: predictions squared, weights 1
            def update(self, *, predictions, labels, weights, **kwargs):
                super().update(predictions=predictions ** 2, labels=labels, weights=torch.ones_like(weights),
                               **kwargs)

        class UserMetric(_class(library, module, metric)):
            _computation_class = Squared

        metrics.append(UserMetric(world_size=1, my_rank=0, batch_size=BATCH, tasks=[config.RecTaskInfo(name="click")],
                                  window_size=10))
    stream = _batches(31, n_tasks=1)
    for step, (predictions, labels, weights) in enumerate(stream):
        if step == 3:
            for metric in metrics:
                metric.reset()
        for metric in metrics:
            metric.update(predictions={"click": predictions[0]}, labels={"click": labels[0]},
                          weights={"click": weights[0]})
        expected, got = (metric.compute() for metric in metrics)
        assert list(got) == list(expected)
        for key, value in expected.items():
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            torch.testing.assert_close(got[key], value, rtol=1e-6, atol=1e-6, msg=f"step {step} {key}")
