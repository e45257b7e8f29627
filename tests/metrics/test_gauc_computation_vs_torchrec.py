"""gauc's functions (compute_gauc_3d, to_3d, get_auc_states, compute_window_auc) and GAUCMetricComputation against
TorchRec 1.8's on the same sessions: values and dtypes, the states after every update, the reports, and a RecMetric
written the TorchRec way with the computation, fused and unfused."""

import importlib

import pytest
import torch

from tests.metrics.torchrec_pairs import user_metrics

torchrec = pytest.importorskip("torchrec")
pytest.importorskip("fbgemm_gpu")  # TorchRec's to_3d is fbgemm's jagged_2d_to_dense

LIBRARIES = ("torchrec", "rectoolkit")
N_TASKS = 2


def _pair(name):
    return [getattr(importlib.import_module(f"{library}.metrics.gauc"), name) for library in LIBRARIES]


def _assert_same(got, expected):
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            _assert_same(got[key], expected[key])
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def _sessions(seed, sizes, n_tasks=N_TASKS):
    """[n_tasks, batch] predictions (some ties and zeros), 0/1 labels, weights; the session sizes."""
    generator = torch.Generator().manual_seed(seed)
    batch = sum(sizes)
    predictions = torch.randint(0, 6, (n_tasks, batch), generator=generator) / 5
    labels = (torch.rand(n_tasks, batch, generator=generator) > 0.5).float()
    weights = torch.rand(n_tasks, batch, generator=generator)
    return predictions, labels, weights, torch.tensor(sizes)


SIZES = [[3, 5], [1, 4, 2, 6], [7], [2, 0, 3]]


@pytest.mark.parametrize("sizes", SIZES, ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_functions_equal_torchrecs(seed, sizes):
    # float32: TorchRec's fbgemm jagged_to_padded_dense has no float64 kernel on CPU (ours takes both)
    predictions, labels, weights, num_candidates = _sessions(seed, sizes)
    (their_states, our_states), (their_3d, our_3d), (their_window, our_window) = (
        _pair("get_auc_states"), _pair("to_3d"), _pair("compute_window_auc"))
    expected = their_states(labels, predictions, weights, num_candidates)
    _assert_same(our_states(labels, predictions, weights, num_candidates), expected)
    for longest in (max(sizes), max(sizes) + 2, max(1, max(sizes) - 1)):  # padded, and cut
        _assert_same(our_3d(predictions.permute(1, 0).contiguous(), num_candidates, longest),
                     their_3d(predictions.permute(1, 0).contiguous(), num_candidates, longest))
    _assert_same(our_window(expected["auc_sum"], expected["num_samples"]),
                 their_window(expected["auc_sum"], expected["num_samples"]))


def test_compute_gauc_3d_equals_torchrecs():
    their, ours = _pair("compute_gauc_3d")
    generator = torch.Generator().manual_seed(5)
    predictions = torch.rand(N_TASKS, 4, 6, generator=generator)
    predictions[0, 1] = 0.5  # a session of equal predictions: not counted
    labels = (torch.rand(N_TASKS, 4, 6, generator=generator) > 0.5).float()
    labels[1, 2] = 1.0  # positives only: not counted
    weights = torch.rand(N_TASKS, 4, 6, generator=generator)
    _assert_same(ours(predictions, labels, weights), their(predictions, labels, weights))


def test_computation_states_and_reports_equal_torchrecs():
    built = [getattr(importlib.import_module(f"{library}.metrics.gauc"), "GAUCMetricComputation")(
        my_rank=0, batch_size=8, n_tasks=N_TASKS, window_size=16) for library in LIBRARIES]
    expected, got = built
    for step, sizes in enumerate([[3, 5], [1, 4, 3], [8], [2, 6]]):
        predictions, labels, weights, num_candidates = _sessions(10 + step, sizes)
        for computation in built:
            computation.update(predictions=predictions, labels=labels, weights=weights, num_candidates=num_candidates)
        _assert_same({name: getattr(got, name) for name in got._defaults},
                     {name: getattr(expected, name) for name in expected._defaults})
        theirs, ours = expected.compute(), got.compute()
        assert [(str(r.name), str(r.metric_prefix)) for r in ours] == \
            [(str(r.name), str(r.metric_prefix)) for r in theirs]
        for mine, their in zip(ours, theirs):
            _assert_same(mine.value, their.value)
    _assert_same(dict(got.state_dict()), dict(expected.state_dict()))


@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_rec_metric_with_the_computation_equals_torchrec(mode):
    tasks = ["click", "like"]
    metrics = user_metrics("gauc", "GAUCMetricComputation", "GAUC", tasks, mode, batch_size=8, window_size=16)
    for step, sizes in enumerate([[3, 5], [4, 4], [8]]):
        predictions, labels, weights, num_candidates = _sessions(20 + step, sizes)
        batch = [{t: tensor[i] for i, t in enumerate(tasks)} for tensor in (predictions, labels, weights)]
        for metric in metrics:
            metric.update(predictions=batch[0], labels=batch[1], weights=batch[2], num_candidates=num_candidates)
        expected, got = (metric.compute() for metric in metrics)
        _assert_same(got, expected)


def test_num_candidates_missing_or_wrong_refused_by_name():
    computation = _pair("GAUCMetricComputation")[1](my_rank=0, batch_size=8, n_tasks=1, window_size=16)
    predictions, labels, weights, _ = _sessions(0, [8], n_tasks=1)
    with pytest.raises(KeyError, match="GAUCMetricComputation.update: num_candidates is missing"):
        computation.update(predictions=predictions, labels=labels, weights=weights)
    with pytest.raises(ValueError, match=r"num_candidates \(2 sessions\) sums to 7 but the batch has 8 samples"):
        computation.update(predictions=predictions, labels=labels, weights=weights, num_candidates=torch.tensor([3, 4]))
