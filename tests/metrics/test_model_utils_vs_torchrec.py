"""rectoolkit.metrics.model_utils against TorchRec 1.8's torchrec.metrics.model_utils on the same model outputs: the
parsed tensors (values, shapes, dtypes), the dicts per task, the model output written back, and the same failures
(ValueError / AssertionError / KeyError, ours naming the keys and sizes)."""

import copy
import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

LIBRARIES = ("torchrec", "rectoolkit")


def _both(name):
    return [getattr(importlib.import_module(f"{library}.metrics.model_utils"), name) for library in LIBRARIES]


def _assert_same(got, expected):
    if isinstance(expected, dict):
        assert list(got) == list(expected)
        for key in expected:
            _assert_same(got[key], expected[key])
    elif isinstance(expected, (tuple, list)) and not isinstance(expected, str):
        assert type(got) is type(expected) and len(got) == len(expected)
        for got_item, expected_item in zip(got, expected):
            _assert_same(got_item, expected_item)
    elif isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    else:
        assert got == expected


@pytest.mark.parametrize("session_ids", [["a"], ["a", "a", "b", "a", "a"], [3, 3, 1, 2, 2, 2], ["x", "y", "z"]])
def test_session_ids_to_tensor(session_ids):
    theirs, ours = _both("session_ids_to_tensor")
    _assert_same(ours(session_ids), theirs(session_ids))


def test_session_ids_to_tensor_of_nothing_is_empty():
    """An empty list gives no session (TorchRec's gives [1], one session id for no sample)."""
    _, ours = _both("session_ids_to_tensor")
    assert ours([]).shape == (0,) and ours([]).dtype == torch.int64


@pytest.mark.parametrize("sizes", [(0, 0, 0), (0, 1, 0), (1, 1, 1), (0, 0, 2)])
def test_is_empty_signals(sizes):
    theirs, ours = _both("is_empty_signals")
    tensors = [torch.zeros(size) for size in sizes]
    assert ours(*tensors) == theirs(*tensors)


def _model_out(batch, label_shape=(), prediction_shape=(), weight_shape=(), seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {"label": (torch.rand(batch, *label_shape, generator=generator) > 0.5).float(),
            "prediction": torch.rand(batch, *prediction_shape, generator=generator),
            "weight": torch.rand(batch, *weight_shape, generator=generator),
            "session": torch.tensor([[7], [7], [9], [9], [9]])[:batch]}


LAYOUTS = {
    "per sample": _model_out(5),
    "per sample [batch, 1]": _model_out(5, (1,), (1,), (1,)),
    "one sample": _model_out(1, (1,), (1,), (1,)),
    "vector valued": _model_out(5, (3,), (3,)),
    "multiclass": _model_out(5, (), (4,)),
    "empty": _model_out(0),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_parse_model_outputs(layout):
    theirs, ours = _both("parse_model_outputs")
    model_out = LAYOUTS[layout]
    _assert_same(ours("label", "prediction", "weight", dict(model_out)),
                 theirs("label", "prediction", "weight", dict(model_out)))
    _assert_same(ours("label", "", "", dict(model_out)), theirs("label", "", "", dict(model_out)))


@pytest.mark.parametrize("names, error", [
    (("nope", "prediction", "weight"), ValueError),
    (("label", "nope", "weight"), ValueError),
    (("label", "prediction", "nope"), ValueError),
    (("label", "", "weight"), AssertionError),
])
def test_parse_model_outputs_refuses_missing_names_as_torchrec(names, error):
    for parse in _both("parse_model_outputs"):
        with pytest.raises(error):
            parse(*names, _model_out(5))


@pytest.mark.parametrize("shapes", [((5,), (4,), (5,)), ((5,), (5,), (3,)), ((5,), (5, 3), (4,)),
                                    ((5, 2), (5, 2), (4,))])
def test_parse_model_outputs_refuses_mismatched_sizes_as_torchrec(shapes):
    model_out = {name: torch.rand(shape) for name, shape in zip(("label", "prediction", "weight"), shapes)}
    theirs, ours = _both("parse_model_outputs")
    with pytest.raises(AssertionError):
        theirs("label", "prediction", "weight", dict(model_out))
    with pytest.raises(AssertionError, match=r"labels \(.*\), predictions \(.*\), weights \(.*\)"):
        ours("label", "prediction", "weight", dict(model_out))


@pytest.mark.parametrize("transform", [False, True])
@pytest.mark.parametrize("session", [["s1", "s1", "s2", "s3", "s3"], torch.tensor([[1], [1], [2], [2], [5]])])
def test_parse_required_inputs(session, transform):
    theirs, ours = _both("parse_required_inputs")
    dense = torch.rand(5, 1, generator=torch.Generator().manual_seed(1))
    outputs = [{"session": copy.deepcopy(session), "dense": dense.clone()} for _ in LIBRARIES]
    if isinstance(session, list) and not transform:  # TorchRec squeezes the list: AttributeError; ours names it
        with pytest.raises(AttributeError):
            theirs(outputs[0], ["session", "dense"], transform)
        with pytest.raises(AssertionError, match=r"model_out\['session'\] is a list"):
            ours(outputs[1], ["session", "dense"], transform)
        return
    _assert_same(ours(outputs[1], ["session", "dense"], transform), theirs(outputs[0], ["session", "dense"], transform))
    _assert_same(outputs[1], outputs[0])  # the session numbers written back into model_out, as TorchRec's


def test_parse_required_inputs_missing_is_a_key_error_as_torchrec():
    for parse in _both("parse_required_inputs"):
        with pytest.raises(KeyError):
            parse({"dense": torch.ones(3)}, ["session"])


@pytest.mark.parametrize("ndcg", [False, True])
@pytest.mark.parametrize("required", [None, ["session"]])
def test_parse_task_model_outputs(required, ndcg):
    model_out = {"click_label": torch.tensor([[1.0], [0.0], [1.0]]), "click_pred": torch.rand(3, 1),
                 "click_weight": torch.rand(3, 1), "like_label": torch.tensor([0.0, 1.0, 1.0]),
                 "empty_label": torch.zeros(0), "empty_pred": torch.zeros(0), "empty_weight": torch.zeros(0),
                 "session": ["u", "u", "v"]}
    results, outputs = [], []
    for library in LIBRARIES:
        config = importlib.import_module(f"{library}.metrics.metrics_config")
        tasks = [config.RecTaskInfo(name="ndcg_click" if ndcg else "click", label_name="click_label",
                                    prediction_name="click_pred", weight_name="click_weight"),
                 config.RecTaskInfo(name="like", label_name="like_label", prediction_name="", weight_name=""),
                 config.RecTaskInfo(name="empty", label_name="empty_label", prediction_name="empty_pred",
                                    weight_name="empty_weight")]
        outputs.append(copy.deepcopy(model_out))
        parse = getattr(importlib.import_module(f"{library}.metrics.model_utils"), "parse_task_model_outputs")
        if required and not ndcg:  # a list of session ids is numbered only for an "ndcg..." task, in both
            with pytest.raises(AttributeError if library == "torchrec" else AssertionError):
                parse(tasks, outputs[-1], required)
            continue
        results.append(parse(tasks, outputs[-1], required))
    if results:
        _assert_same(results[1], results[0])
        _assert_same(outputs[1], outputs[0])
