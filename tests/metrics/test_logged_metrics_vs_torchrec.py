"""TensorWeightedAvgMetric, ScalarMetric and OutputMetric against TorchRec 1.8's on the same batches (keys, values,
state_dict), alone and through generate_metric_module, and against hand-worked numbers."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

from rectoolkit.metrics.rec_metric import RecMetricException  # noqa: E402
from tests.metrics.torchrec_pairs import assert_same_values, feed_both, generate_both  # noqa: E402

TASKS = ["click", "like"]
BATCH = 4
MODES = ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION", "FUSED_TASKS_AND_STATES_COMPUTATION"]
# module: class
CLASSES = {"tensor_weighted_avg": "TensorWeightedAvgMetric", "scalar": "ScalarMetric", "output": "OutputMetric"}


def task_infos(config, weighted=(True, False)):
    """Each task averages its own tensor, the first weighted, the second not (tensor_weighted_avg reads them)."""
    return [config.RecTaskInfo(name=t, label_name=f"{t}_y", prediction_name=f"{t}_p", weight_name=f"{t}_w",
                               tensor_name=f"{t}_x", weighted=w) for t, w in zip(TASKS, weighted)]


def make(library, module, mode, window_size, **kwargs):
    cls = getattr(importlib.import_module(f"{library}.metrics.{module}"), CLASSES[module])
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    return cls(world_size=1, my_rank=0, batch_size=BATCH, tasks=task_infos(config),
               compute_mode=getattr(config.RecComputeMode, mode), window_size=window_size, **kwargs)


def batches(count=6, seed=0):
    """(predictions, labels, weights, required_inputs) per update: labels vary per batch (the scalar logged)."""
    generator = torch.Generator().manual_seed(seed)
    stream = []
    for _ in range(count):
        predictions = {t: torch.rand(BATCH, generator=generator) for t in TASKS}
        labels = {t: torch.rand(BATCH, generator=generator) * 10 for t in TASKS}
        weights = {t: torch.rand(BATCH, generator=generator) * 2 for t in TASKS}
        required = {f"{t}_x": torch.randn(BATCH, generator=generator) for t in TASKS}
        required["latest_imp"] = torch.randint(0, 100, (BATCH,), generator=generator)
        required["total_latest_imp"] = torch.randint(100, 1000, (BATCH,), generator=generator)
        stream.append((predictions, labels, weights, required))
    return stream


def feed(metric, stream):
    for predictions, labels, weights, required in stream:
        metric.update(predictions=predictions, labels=labels, weights=weights, required_inputs=required)
    return metric.compute()


@pytest.mark.torchrec
@pytest.mark.parametrize("window_size", [2, 10_000])  # these count rows, not samples: 2 updates (1 fused)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("module", list(CLASSES))
def test_same_keys_values_and_state_dict_as_torchrec(module, mode, window_size):
    if module == "output" and mode != "UNFUSED_TASKS_COMPUTATION":  # TorchRec's fails in compute(): refused here
        theirs = make("torchrec", module, mode, max(window_size, BATCH))
        with pytest.raises(TypeError):
            feed(theirs, batches())
        with pytest.raises(RecMetricException, match=f"OutputMetric: compute_mode={mode} is not supported"):
            make("rectoolkit", module, mode, max(window_size, BATCH))
        return
    extra = {"description": "_bid"} if module == "tensor_weighted_avg" else {}
    theirs = make("torchrec", module, mode, max(window_size, BATCH), **extra)
    ours = make("rectoolkit", module, mode, max(window_size, BATCH), **extra)
    assert ours.get_required_inputs() == theirs.get_required_inputs()
    stream = batches()
    expected, got = feed(theirs, stream), feed(ours, stream)
    assert_same_values(got, expected)
    if module != "output":
        lifetime = [value for key, value in got.items() if "lifetime" in key]
        window = [value for key, value in got.items() if "window" in key]
        assert any(not torch.equal(a, b) for a, b in zip(lifetime, window)) or window_size > BATCH
    their_state, our_state = theirs.state_dict(), ours.state_dict()
    assert list(our_state) == list(their_state)
    for key, value in their_state.items():
        torch.testing.assert_close(our_state[key], value, rtol=1e-6, atol=1e-9, msg=key)


@pytest.mark.torchrec
def test_generate_metric_module_builds_them_as_torchrec():
    def config(package):
        metrics = {getattr(package.RecMetricEnum, member): package.RecMetricDef(rec_task_indices=[0, 1], window_size=8)
                   for member in ("TENSOR_WEIGHTED_AVG", "SCALAR", "OUTPUT")}
        return package.MetricsConfig(rec_tasks=task_infos(package), rec_metrics=metrics)

    modules = generate_both(config, BATCH)
    assert sorted(modules[1].get_required_inputs()) == sorted(modules[0].get_required_inputs())
    expected, got = feed_both(modules, batches(), TASKS)
    assert_same_values(got, expected)
    assert len(got) == 4 + 4 + 4


def test_hand_worked_values():
    from rectoolkit.metrics.metrics_config import RecComputeMode, RecTaskInfo
    from rectoolkit.metrics.scalar import ScalarMetric
    from rectoolkit.metrics.tensor_weighted_avg import TensorWeightedAvgMetric

    tasks = [RecTaskInfo(name="a", tensor_name="x"), RecTaskInfo(name="b", tensor_name="y", weighted=False)]
    metric = TensorWeightedAvgMetric(world_size=1, my_rank=0, batch_size=2, tasks=tasks,
                                     compute_mode=RecComputeMode.FUSED_TASKS_COMPUTATION)
    ones = {"a": torch.zeros(2), "b": torch.zeros(2)}
    metric.update(predictions=ones, labels=ones, weights={"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([1.0, 3.0])},
                  required_inputs={"x": torch.tensor([4.0, 8.0]), "y": torch.tensor([4.0, 8.0])})
    values = {key: float(value) for key, value in metric.compute().items()}
    assert values["weighted_avg-a|lifetime_weighted_avg"] == pytest.approx((4 + 24) / 4)
    assert values["weighted_avg-b|lifetime_weighted_avg"] == pytest.approx(6.0)  # not weighted: the plain mean
    scalar = ScalarMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="lr")], window_size=2)
    for value in (1.0, 2.0, 6.0):  # the window holds the last 2 updates
        scalar.update(predictions={"lr": torch.zeros(2)}, labels={"lr": torch.full((2,), value)}, weights=None)
    assert {key: value.tolist() for key, value in scalar.compute().items()} == {
        "scalar-lr|lifetime_scalar": [6.0], "scalar-lr|window_scalar": [4.0]}


def test_refusals():
    from rectoolkit.metrics.metrics_config import RecTaskInfo
    from rectoolkit.metrics.output import OutputMetric
    from rectoolkit.metrics.rec_metric import RecMetricException
    from rectoolkit.metrics.tensor_weighted_avg import TensorWeightedAvgMetric

    with pytest.raises(RecMetricException, match="expects all tasks to have tensor_name"):
        TensorWeightedAvgMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    metric = TensorWeightedAvgMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t", tensor_name="x")])
    with pytest.raises(RecMetricException, match="expects required_inputs to contain target tensor x"):
        metric.update(predictions={"t": torch.zeros(2)}, labels={"t": torch.zeros(2)}, weights=None,
                      required_inputs={"z": torch.zeros(2)})
    output = OutputMetric(world_size=1, my_rank=0, batch_size=2, tasks=[RecTaskInfo(name="t")])
    with pytest.raises(RecMetricException, match="requires 'latest_imp' and 'total_latest_imp'"):
        output.update(predictions={"t": torch.zeros(2)}, labels={"t": torch.zeros(2)}, weights=None)


# ------------------------------------------------------------------------------------------------ 2 ranks
def _two_rank_worker(rank, world_size, stream, expected):
    for module in CLASSES:
        cls = getattr(importlib.import_module(f"rectoolkit.metrics.{module}"), CLASSES[module])
        config = importlib.import_module("rectoolkit.metrics.metrics_config")
        metric = cls(world_size=world_size, my_rank=rank, batch_size=BATCH, tasks=task_infos(config),
                     window_size=10_000, compute_on_all_ranks=True)
        got = feed(metric, stream[rank::world_size])
        assert list(got) == list(expected[module])
        for key, value in expected[module].items():
            if "window" not in key:
                torch.testing.assert_close(got[key], value, rtol=1e-9, atol=1e-12, msg=f"rank {rank} {key}")


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_reduce_as_torchrecs_dist_reduce_fx():
    """Tensor weighted average: sums over all ranks' batches; scalar: the mean of the ranks' latest values; output:
    the sum of the ranks' latest values (each computed here from one-process metrics of each rank's batches)."""
    from tests.distributed.dist_harness import run_workers

    stream = batches(count=6, seed=2)
    per_rank = [{module: feed(make("rectoolkit", module, "UNFUSED_TASKS_COMPUTATION", 10_000), stream[rank::2])
                 for module in CLASSES} for rank in range(2)]
    expected = {"tensor_weighted_avg": feed(make("rectoolkit", "tensor_weighted_avg", "UNFUSED_TASKS_COMPUTATION",
                                                 10_000), stream),
                "scalar": {key: (per_rank[0]["scalar"][key] + per_rank[1]["scalar"][key]) / 2
                           for key in per_rank[0]["scalar"]},
                "output": {key: per_rank[0]["output"][key] + per_rank[1]["output"][key] for key in per_rank[0]["output"]}}
    run_workers(_two_rank_worker, 2, stream, expected)
