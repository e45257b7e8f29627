"""ndcg.NDCGComputation against TorchRec 1.8's on the same sessions: the states after every update, the reports and
state_dict, with each of TorchRec's options, negative tasks, and sessions all removed; then a RecMetric written the
TorchRec way with it, fused (TorchRec's [n_tasks, batch] session ids)."""

import importlib

import pytest
import torch

from tests.metrics.torchrec_pairs import assert_same_values, user_metrics

torchrec = pytest.importorskip("torchrec")

LIBRARIES = ("torchrec", "rectoolkit")
N_TASKS, BATCH = 2, 8
OPTIONS = [{}, {"exponential_gain": True}, {"k": 2}, {"report_ndcg_as_decreasing_curve": False},
           {"remove_single_length_sessions": True}, {"scale_by_weights_tensor": True},
           {"is_negative_task_mask": [False, True]}, {"session_key": "query"}]


def _computations(**options):
    return [getattr(importlib.import_module(f"{library}.metrics.ndcg"), "NDCGComputation")(
        my_rank=0, batch_size=BATCH, n_tasks=N_TASKS, window_size=2 * BATCH, **options) for library in LIBRARIES]


def _batch(seed, single_sessions=False):
    """Continuous predictions, graded labels in [0, 1], weights, and session ids ([n_tasks, batch], equal rows)."""
    generator = torch.Generator().manual_seed(seed)
    predictions = torch.rand(N_TASKS, BATCH, generator=generator)
    labels = torch.randint(0, 3, (N_TASKS, BATCH), generator=generator) / 2
    weights = torch.rand(N_TASKS, BATCH, generator=generator)
    sessions = torch.arange(BATCH) if single_sessions else torch.tensor([4, 4, 4, 7, 7, 9, 2, 2])
    return predictions, labels, weights, sessions.expand(N_TASKS, BATCH).clone()


def _states(computation):
    return {name: getattr(computation, name) for name in computation._defaults}


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_states_and_reports_equal_torchrec(options):
    built = _computations(**options)
    key = options.get("session_key", "session_id")
    for step in range(4):
        predictions, labels, weights, sessions = _batch(step, single_sessions=step == 2)
        for computation in built:  # copies: TorchRec flips a negative task's inputs in place
            computation.update(predictions=predictions.clone(), labels=labels.clone(), weights=weights.clone(),
                               required_inputs={key: sessions})
        assert_same_values(_states(built[1]), _states(built[0]))
        reports = [{(str(r.name), str(r.metric_prefix)): r.value for r in c.compute()} for c in built]
        assert_same_values(reports[1], reports[0])
    assert_same_values(dict(built[1].state_dict()), dict(built[0].state_dict()))


def test_missing_sessions_and_wrong_shapes_refused_as_torchrec():
    predictions, labels, weights, sessions = _batch(0)
    for library, computation in zip(LIBRARIES, _computations()):
        exception = getattr(importlib.import_module(f"{library}.metrics.rec_metric"), "RecMetricException")
        with pytest.raises(exception):
            computation.update(predictions=predictions, labels=labels, weights=weights, required_inputs={})
        with pytest.raises(AssertionError):  # one row of session ids: TorchRec asserts [n_tasks, batch]
            computation.update(predictions=predictions, labels=labels, weights=weights,
                               required_inputs={"session_id": sessions[0]})
    with pytest.raises(ValueError, match=r"session ids \(8,\) must all be \[n_tasks, batch\]"):
        _computations()[1].update(predictions=predictions, labels=labels, weights=weights,
                                  required_inputs={"session_id": sessions[0]})


def test_k_refused_by_name():
    computation = getattr(importlib.import_module("rectoolkit.metrics.ndcg"), "NDCGComputation")
    with pytest.raises(ValueError, match="NDCGComputation: k=0 must be a positive int"):
        computation(my_rank=0, batch_size=2, n_tasks=1, window_size=4, k=0)


@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
def test_rec_metric_with_the_computation_equals_torchrec(mode):
    """Unfused, the session ids of one row ([batch], laid out per task); fused, TorchRec's [n_tasks, batch]."""
    tasks = ["click", "like"]
    metrics = user_metrics("ndcg", "NDCGComputation", "NDCG", tasks, mode, batch_size=BATCH, window_size=2 * BATCH,
                           exponential_gain=True)
    for step in range(3):
        predictions, labels, weights, sessions = _batch(10 + step)
        batch = [{t: tensor[i] for i, t in enumerate(tasks)} for tensor in (predictions, labels, weights)]
        session_ids = sessions if mode.startswith("FUSED") else sessions[0]
        for metric in metrics:
            metric.update(predictions=batch[0], labels=batch[1], weights=batch[2],
                          required_inputs={"session_id": session_ids})
        assert_same_values(metrics[1].compute(), metrics[0].compute())
