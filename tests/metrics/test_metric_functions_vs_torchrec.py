"""rectoolkit.metrics.<m>.compute_* / get_*_states against TorchRec 1.8's on the same inputs."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

ETA = 1e-12
SHAPES = [(1, 5), (3, 17), (2, 1)]
DTYPES = [torch.float32, torch.float64]


def _torchrec(module):
    return importlib.import_module(f"torchrec.metrics.{module}")


def _pair(module, name):
    ours = getattr(importlib.import_module(f"rectoolkit.metrics.{module}"), name)
    theirs = getattr(importlib.import_module(f"torchrec.metrics.{module}"), name)
    return ours, theirs


def _batch(shape, dtype, seed, zero_task=False):
    gen = torch.Generator().manual_seed(seed)
    predictions = torch.rand(shape, generator=gen, dtype=dtype)
    labels = (torch.rand(shape, generator=gen) > 0.5).to(dtype)
    weights = torch.rand(shape, generator=gen, dtype=dtype)
    weights[torch.rand(shape, generator=gen) < 0.3] = 0.0
    if zero_task:
        weights[0] = 0.0
    return labels, predictions, weights


def _check(ours, theirs):
    if isinstance(theirs, dict):
        assert list(ours) == list(theirs)
        for key in theirs:
            torch.testing.assert_close(ours[key], theirs[key], equal_nan=True)
    else:
        torch.testing.assert_close(ours, theirs, equal_nan=True)


# (module, function, extra args after (labels, predictions, weights))
STATE_FUNCTIONS = [
    ("ne", "compute_cross_entropy", (ETA,)),
    ("ne", "get_ne_states", (ETA,)),
    ("ctr", "get_ctr_states", ()),
    ("calibration", "get_calibration_states", ()),
    ("mse", "compute_error_sum", ()),
    ("mse", "get_mse_states", ()),
    ("mae", "compute_error_sum", ()),
    ("mae", "get_mae_states", ()),
    ("accuracy", "compute_accuracy_sum", ()),
    ("accuracy", "compute_accuracy_sum", (0.3,)),
    ("accuracy", "get_accuracy_states", ()),
    ("accuracy", "get_accuracy_states", (0.7,)),
    ("precision", "compute_true_pos_sum", ()),
    ("precision", "compute_false_pos_sum", (0.2,)),
    ("precision", "get_precision_states", ()),
    ("recall", "compute_true_pos_sum", ()),
    ("recall", "compute_false_neg_sum", ()),
    ("recall", "get_recall_states", (0.6,)),
    ("ne_positive", "compute_cross_entropy_positive", (ETA,)),
    ("ne_positive", "get_ne_positive_states", (ETA,)),
    ("cali_free_ne", "compute_cross_entropy", (ETA,)),
    ("cali_free_ne", "get_cali_free_ne_states", (ETA,)),
    ("unweighted_ne", "compute_cross_entropy", (ETA,)),
    ("unweighted_ne", "get_unweighted_ne_states", (ETA,)),
    ("nmse", "get_norm_mse_states", ()),
    ("xauc", "compute_error_sum", ()),
    ("xauc", "get_xauc_states", ()),
    ("average", "get_average_states", ()),
    ("sum_weights", "compute_weighted_sum", ()),
    ("sum_weights", "get_weighted_sum_states", ()),
    ("num_positive_samples", "compute_weighted_pos_sum", ()),
    ("num_positive_samples", "get_num_positive_sample_states", ()),
    ("num_missing_labels", "compute_missing_label_sum", ()),
    ("num_missing_labels", "get_num_missing_labels_states", ()),
    ("weighted_sum_predictions", "compute_weighted_predictions_sum", ()),
    ("weighted_sum_predictions", "get_weighted_sum_prediction_states", ()),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_xauc_weighted_num_pairs(shape, dtype):
    ours, theirs = _pair("xauc", "compute_weighted_num_pairs")
    _, _, weights = _batch(shape, dtype, seed=7)
    _check(ours(weights), theirs(weights))


def test_xauc_ties():
    """Tied predictions and labels count as ordered alike, as TorchRec's."""
    ours, theirs = _pair("xauc", "get_xauc_states")
    labels = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    predictions = torch.tensor([[0.5, 0.5, 0.5, 0.2, 0.9]])
    weights = torch.tensor([[1.0, 2.0, 0.0, 1.0, 0.5]])
    _check(ours(labels, predictions, weights), theirs(labels, predictions, weights))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("module,name,extra", STATE_FUNCTIONS)
def test_state_functions(module, name, extra, shape, dtype):
    ours, theirs = _pair(module, name)
    labels, predictions, weights = _batch(shape, dtype, seed=sum(shape))
    _check(ours(labels, predictions, weights, *extra), theirs(labels, predictions, weights, *extra))


@pytest.mark.parametrize("module,name", [("accuracy", "get_accuracy_states"), ("precision", "get_precision_states"),
                                         ("recall", "get_recall_states"), ("sum_weights", "get_weighted_sum_states"),
                                         ("num_positive_samples", "get_num_positive_sample_states"),
                                         ("num_missing_labels", "get_num_missing_labels_states"),
                                         ("weighted_sum_predictions", "get_weighted_sum_prediction_states")])
def test_states_without_weights(module, name):
    ours, theirs = _pair(module, name)
    labels, predictions, _ = _batch((2, 9), torch.float32, seed=3)
    _check(ours(labels, predictions, None), theirs(labels, predictions, None))


@pytest.mark.parametrize("module,name", [("num_positive_samples", "get_num_positive_sample_states"),
                                         ("num_missing_labels", "get_num_missing_labels_states"),
                                         ("weighted_sum_predictions", "get_weighted_sum_prediction_states")])
def test_counting_states_with_nan(module, name):
    """The counting metrics' nan labels / predictions (missing labels), as TorchRec's."""
    ours, theirs = _pair(module, name)
    labels, predictions, weights = _batch((2, 9), torch.float32, seed=4)
    labels[0, ::2] = float("nan")
    predictions[1, 1::3] = float("nan")
    _check(ours(labels, predictions, weights), theirs(labels, predictions, weights))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("shape", [(1, 12), (12,), (1, 1), (3, 3)])
def test_ranking_within_session(shape, seed):
    """Session ranks with ties, for a task's [1, batch] row and the other shapes TorchRec's layout takes."""
    ours, theirs = _pair("recall_session", "ranking_within_session")
    generator = torch.Generator().manual_seed(seed)
    predictions = torch.randint(0, 4, shape, generator=generator).float() / 4  # ties
    session = torch.randint(0, 3, shape, generator=generator)
    _check(ours(predictions, session), theirs(predictions, session))
    _check(ours(predictions.double(), session), theirs(predictions.double(), session))


def _states(shape, dtype, seed, zero_task):
    """TorchRec's own states for a batch (the inputs of the compute_* functions), a task without weight if asked."""
    labels, predictions, weights = _batch(shape, dtype, seed, zero_task)
    states = {}
    states.update(_torchrec("ne").get_ne_states(labels, predictions, weights, ETA))
    states.update(_torchrec("ctr").get_ctr_states(labels, predictions, weights))
    states.update(_torchrec("calibration").get_calibration_states(labels, predictions, weights))
    states.update({"mse_" + k: v for k, v in _torchrec("mse").get_mse_states(labels, predictions, weights).items()})
    states.update({"mae_" + k: v for k, v in _torchrec("mae").get_mae_states(labels, predictions, weights).items()})
    states.update(_torchrec("accuracy").get_accuracy_states(labels, predictions, weights))
    states.update(_torchrec("precision").get_precision_states(labels, predictions, weights))
    states.update(_torchrec("recall").get_recall_states(labels, predictions, weights))
    states.update(_torchrec("ne_positive").get_ne_positive_states(labels, predictions, weights, ETA))
    states.update(_torchrec("cali_free_ne").get_cali_free_ne_states(labels, predictions, weights, ETA))
    states["const_pred_error_sum"] = _torchrec("nmse").get_norm_mse_states(
        labels, predictions, weights)["const_pred_error_sum"]
    states.update({"xauc_" + k: v for k, v in _torchrec("xauc").get_xauc_states(labels, predictions, weights).items()})
    states.update(_torchrec("average").get_average_states(labels, predictions, weights))
    # the states in the inputs' dtype too (TorchRec's computations keep float64 states, a user may not)
    return {k: v.to(dtype) for k, v in states.items()}


# (module, function, state names, extra args)
COMPUTE_FUNCTIONS = [
    ("ne", "compute_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"), (ETA,)),
    ("ne", "compute_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"), (ETA, True)),
    ("ne", "compute_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"), (1e-6, False)),
    ("ne", "compute_logloss", ("cross_entropy_sum", "pos_labels", "neg_labels"), (ETA,)),
    ("ctr", "compute_ctr", ("ctr_num", "ctr_denom"), ()),
    ("calibration", "compute_calibration", ("calibration_num", "calibration_denom"), ()),
    ("mse", "compute_mse", ("mse_error_sum", "mse_weighted_num_samples"), ()),
    ("mse", "compute_rmse", ("mse_error_sum", "mse_weighted_num_samples"), ()),
    ("mse", "compute_r_squared", ("mse_error_sum", "mse_weighted_num_samples", "mse_label_sum",
                                  "mse_label_squared_sum"), ()),
    ("mae", "compute_mae", ("mae_error_sum", "mae_weighted_num_samples"), ()),
    ("accuracy", "compute_accuracy", ("accuracy_sum", "weighted_num_samples"), ()),
    ("precision", "compute_precision", ("true_pos_sum", "false_pos_sum"), ()),
    ("recall", "compute_recall", ("true_pos_sum", "false_neg_sum"), ()),
    ("ne_positive", "compute_ne_positive", ("cross_entropy_positive_sum", "weighted_num_samples", "pos_labels",
                                            "neg_labels"), (ETA,)),
    ("ne_positive", "compute_ne_positive", ("cross_entropy_positive_sum", "weighted_num_samples", "pos_labels",
                                            "neg_labels"), (ETA, True)),
    ("unweighted_ne", "compute_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"), (ETA,)),
    ("unweighted_ne", "compute_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels"), (ETA, True)),
    ("cali_free_ne", "compute_cali_free_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels",
                                              "neg_labels", "weighted_sum_predictions"), (ETA,)),
    ("cali_free_ne", "compute_cali_free_ne", ("cross_entropy_sum", "weighted_num_samples", "pos_labels",
                                              "neg_labels", "weighted_sum_predictions"), (ETA, True)),
    ("nmse", "compute_norm", ("mse_error_sum", "const_pred_error_sum"), ()),
    ("xauc", "compute_xauc", ("xauc_error_sum", "xauc_weighted_num_pairs"), ()),
    ("average", "compute_average", ("label_sum", "weighted_num_samples"), ()),
    ("average", "compute_average", ("prediction_sum", "weighted_num_samples"), ()),
    ("weighted_avg", "get_mean", ("calibration_num", "weighted_num_samples"), ()),
    ("tensor_weighted_avg", "get_mean", ("calibration_num", "weighted_num_samples"), ()),
    ("multi_label_precision", "compute_multi_label_precision", ("true_pos_sum", "false_pos_sum"), ()),
]


@pytest.mark.parametrize("zero_task", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("module,name,state_names,extra", COMPUTE_FUNCTIONS)
def test_compute_functions(module, name, state_names, extra, shape, dtype, zero_task):
    ours, theirs = _pair(module, name)
    states = _states(shape, dtype, sum(shape) + 1, zero_task)
    args = [states[state] for state in state_names]
    _check(ours(*[a.clone() for a in args], *extra), theirs(*[a.clone() for a in args], *extra))


def test_compute_functions_all_zero():
    """A batch with no weight at all: TorchRec's zero (or one, or nan) wherever it gives one."""
    zeros = torch.zeros(2, dtype=torch.float64)
    for module, name, state_names, extra in COMPUTE_FUNCTIONS:
        ours, theirs = _pair(module, name)
        args = [zeros.clone() for _ in state_names]
        _check(ours(*args, *extra), theirs(*[a.clone() for a in args], *extra))


def _window(shape, dtype, seed, parts):
    """TorchRec's AUC states: lists of [n_tasks, n] tensors; predictions distinct (tied ones differ by design)."""
    labels, _, weights = _batch(shape, dtype, seed)
    n_tasks, n = shape
    predictions = (torch.randperm(n_tasks * n, generator=torch.Generator().manual_seed(seed)).to(dtype)
                   / (n_tasks * n)).view(shape)
    cut = n // 2 if parts == 2 else n
    split = [lambda t: [t]] if parts == 1 else [lambda t: [t[:, :cut], t[:, cut:]]]
    return [split[0](t) for t in (predictions, labels, weights)]


@pytest.mark.parametrize("apply_bin", [False, True])
@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(2, 0)])
def test_compute_auc(shape, dtype, parts, apply_bin):
    ours, theirs = _pair("auc", "compute_auc")
    predictions, labels, weights = _window(shape, dtype, sum(shape) + 5, parts)
    if apply_bin:
        labels = [torch.rand(label.shape, generator=torch.Generator().manual_seed(1), dtype=dtype) / 10
                  for label in labels]
    _check(ours(shape[0], predictions, labels, weights, apply_bin),
           theirs(shape[0], predictions, labels, weights, apply_bin))


@pytest.mark.parametrize("n_groups", [0, 1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compute_auc_per_group(dtype, n_groups):
    ours, theirs = _pair("auc", "compute_auc_per_group")
    n = 24 if n_groups else 0
    predictions, labels, weights = _window((2, n), dtype, 11, 1)
    keys = torch.randint(0, max(n_groups, 1), (n,), generator=torch.Generator().manual_seed(2))
    _check(ours(2, predictions, labels, weights, keys), theirs(2, predictions, labels, weights, keys))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_compute_auprc(shape, dtype, ties):
    ours, theirs = _pair("auprc", "compute_auprc")
    (predictions,), (labels,), (weights,) = _window(shape, dtype, sum(shape) + 9, 1)
    if ties:  # tied predictions are one step in both
        predictions = (predictions * 4).floor() / 4
    _check(ours(shape[0], predictions, labels, weights), theirs(shape[0], predictions, labels, weights))


def test_compute_auprc_no_positive():
    ours, theirs = _pair("auprc", "compute_auprc")
    (predictions,), _, (weights,) = _window((2, 6), torch.float32, 4, 1)
    labels = torch.zeros(2, 6)
    _check(ours(2, predictions, labels, weights), theirs(2, predictions, labels, weights))


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("n_groups", [0, 1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compute_auprc_per_group(dtype, n_groups, padding):
    ours, theirs = _pair("auprc", "compute_auprc_per_group")
    n = 24 if n_groups else 0
    (predictions,), (labels,), (weights,) = _window((2, n), dtype, 13, 1)
    keys = torch.randint(0, max(n_groups, 1), (n,), generator=torch.Generator().manual_seed(3))
    if padding and n:
        keys[0] = -1
    _check(ours(2, predictions, labels, weights, keys), theirs(2, predictions, labels, weights, keys))


def _multiclass(shape, n_classes, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    predictions = torch.rand(*shape, n_classes, generator=gen, dtype=dtype)
    labels = torch.randint(0, n_classes, shape, generator=gen).to(dtype)
    weights = torch.rand(shape, generator=gen, dtype=dtype)
    weights[torch.rand(shape, generator=gen) < 0.3] = 0.0
    return predictions, labels, weights


@pytest.mark.parametrize("n_classes", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(7,), (3, 9), (1, 1)])
def test_multiclass_recall_functions(shape, dtype, n_classes):
    predictions, labels, weights = _multiclass(shape, n_classes, dtype, sum(shape) + n_classes)
    ours, theirs = _pair("multiclass_recall", "get_multiclass_recall_states")
    ours_states = ours(predictions, labels, weights, n_classes)
    _check(ours_states, theirs(predictions, labels, weights, n_classes))
    ours, theirs = _pair("multiclass_recall", "compute_true_positives_at_k")
    _check(ours(predictions, labels, weights, n_classes), theirs(predictions, labels, weights, n_classes))
    ours, theirs = _pair("multiclass_recall", "compute_multiclass_recall_at_k")
    _check(ours(*ours_states.values()), theirs(*ours_states.values()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(17,), (1, 5), (0,)])
def test_hindsight_target_pr_functions(shape, dtype):
    labels, predictions, weights = _batch(shape, dtype, seed=sum(shape) + 21)
    # float32 sums are summed in another order here: float32 precision
    tolerance = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {}
    for name in ("compute_true_pos_sum", "compute_false_pos_sum", "compute_false_neg_sum"):
        ours, theirs = _pair("hindsight_target_pr", name)
        torch.testing.assert_close(ours(labels, predictions, weights), theirs(labels, predictions, weights),
                                   **tolerance)
    ours, theirs = _pair("hindsight_target_pr", "get_pr_states")
    for weights_arg in (weights, None):
        ours_states = ours(labels, predictions, weights_arg)
        theirs_states = theirs(labels, predictions, weights_arg)
        assert list(ours_states) == list(theirs_states)
        for key in theirs_states:
            torch.testing.assert_close(ours_states[key], theirs_states[key], **tolerance)
    tp, fp, fn = theirs_states.values()
    for target in (0.0, 0.3, 0.6, 1.0, 1.5):
        ours, theirs = _pair("hindsight_target_pr", "compute_threshold_idx")
        assert ours(tp, fp, target) == theirs(tp, fp, target)
    for name, args in (("compute_precision", (tp, fp)), ("compute_recall", (tp, fn))):
        ours, theirs = _pair("hindsight_target_pr", name)
        _check(ours(*args), theirs(*args))


@pytest.mark.parametrize("all_positive", [False, True])
@pytest.mark.parametrize("num_groups", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 8, 30])
def test_segmented_ne_functions(n, dtype, num_groups, all_positive):
    labels, predictions, weights = _batch((2, n), dtype, seed=n + num_groups)
    if all_positive:
        labels = torch.ones_like(labels)
    keys = torch.randint(0, num_groups, (n,), generator=torch.Generator().manual_seed(n))
    keys[0] = num_groups - 1
    ours, theirs = _pair("segmented_ne", "get_segemented_ne_states_fused")
    fused_states = theirs(labels, predictions, weights, keys, ETA, num_groups, 2)
    _check(ours(labels, predictions, weights, keys, ETA, num_groups, 2), fused_states)
    ours, theirs = _pair("segmented_ne", "get_segemented_ne_states")
    states = theirs(labels[0], predictions[0], weights[0], keys, ETA, num_groups)
    _check(ours(labels[0], predictions[0], weights[0], keys, ETA, num_groups), states)
    names = ("cross_entropy_sum", "weighted_num_samples", "pos_labels", "neg_labels")
    ours, theirs = _pair("segmented_ne", "compute_ne")
    args = [states[name] for name in names]
    _check(ours(*args, num_groups, ETA), theirs(*args, num_groups, ETA))
    ours, theirs = _pair("segmented_ne", "compute_ne_helper")
    _check(ours(*args, ETA), theirs(*args, ETA))
    ours, theirs = _pair("segmented_ne", "compute_ne_fused")
    fused_args = [fused_states[name] for name in names]
    _check(ours(*fused_args, num_groups, 2, ETA), theirs(*fused_args, num_groups, 2, ETA))
    ours, theirs = _pair("segmented_ne", "compute_logloss")
    _check(ours(args[0], args[2], args[3], ETA), theirs(args[0].clone(), args[2].clone(), args[3].clone(), ETA))
    ours, theirs = _pair("segmented_ne", "compute_cross_entropy")
    _check(ours(labels, predictions, weights, ETA), theirs(labels, predictions, weights, ETA))
