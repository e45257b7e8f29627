"""DeferrableMetrics against TorchRec 1.8's on the same calls: resolved and Future-backed, update before and after
subscribe, a failing future, and what RecMetricModule.compute() returns."""

from __future__ import annotations

import doctest
from concurrent.futures import Future

import pytest
import torch

from rectoolkit.metrics import deferrable_metrics
from rectoolkit.metrics.deferrable_metrics import DeferrableMetrics

torchrec_deferrable = pytest.importorskip("torchrec.metrics.deferrable_metrics")
pytestmark = pytest.mark.torchrec

CLASSES = {"ours": DeferrableMetrics, "theirs": torchrec_deferrable.DeferrableMetrics}


def test_docstring_examples():
    assert doctest.testmod(deferrable_metrics).failed == 0


def script(cls):
    """The same sequence of calls; returns what was observed."""
    seen = {}
    ready = cls({"a": 1})
    ready.update({"b": torch.tensor(2.0)})
    seen["ready"] = (dict(ready), ready.is_resolved(), repr(ready), len(ready), bool(cls({})))
    future = Future()
    pending = cls(future)
    seen["pending_repr"], seen["pending_resolved"], seen["pending_bool"] = repr(pending), pending.is_resolved(), \
        bool(pending)
    early, late = [], []
    pending.subscribe(early.append)      # before the update: sees the values without it
    pending.update({"extra": 3})
    pending.subscribe(late.append)       # after it: sees the merge
    other_future = Future()
    pending.update(cls(other_future))    # a pending DeferrableMetrics: merged when it completes
    future.set_result({"x": 0})
    other_future.set_result({"y": 5})
    seen["after"] = (dict(pending.resolve()), repr(pending), early, late, pending["x"], sorted(pending))
    pending["z"] = 9
    seen["set"] = dict(pending)
    failing, errors = Future(), []
    failed = cls(failing)
    failed.subscribe(lambda values: None, on_error=lambda error: errors.append(str(error)))
    failing.set_exception(ValueError("boom"))
    seen["errors"] = errors
    with pytest.raises(ValueError, match="boom"):
        failed.resolve()
    return seen


def test_same_observations_as_torchrec():
    ours, theirs = script(CLASSES["ours"]), script(CLASSES["theirs"])
    assert ours == theirs
    assert ours["after"][0] == {"x": 0, "extra": 3, "y": 5}  # by hand


def test_metric_module_compute_returns_a_resolved_deferrable_mapping():
    from rectoolkit.metrics.metric_module import RecMetricModule, generate_metric_module
    from rectoolkit.metrics.metrics_config import MetricsConfig, RecMetricDef, RecMetricEnum, RecTaskInfo

    task = RecTaskInfo(name="click")
    config = MetricsConfig(rec_tasks=[task], rec_metrics={RecMetricEnum.CTR: RecMetricDef(rec_tasks=[task])})
    module = generate_metric_module(RecMetricModule, config, batch_size=2, world_size=1, my_rank=0,
                                    state_metrics_mapping={}, device=torch.device("cpu"))
    module.update({"prediction": torch.tensor([0.2, 0.4]), "label": torch.tensor([0.0, 1.0]),
                   "weight": torch.tensor([1.0, 3.0])})
    for result in (module.compute(), module.local_compute()):
        assert isinstance(result, DeferrableMetrics) and result.is_resolved()
    assert float(module.compute()["ctr-click|lifetime_ctr"]) == pytest.approx(0.75)  # 3 / 4 by hand
    assert float(module.local_compute().resolve()["ctr-click|local_window_ctr"]) == pytest.approx(0.75)


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "meta"])
def test_device_supports_async_as_torchrec(device):
    assert deferrable_metrics.device_supports_async(torch.device(device)) == \
        torchrec_deferrable.device_supports_async(torch.device(device))


@pytest.mark.parametrize("values", [{}, {"step": 3}, {"ne": torch.tensor([0.9]),
                                                      "auc": torch.ones(2, dtype=torch.float64), "name": "click"}])
def test_transfer_of_host_values_as_torchrec(values):
    """Without CUDA tensors: the same dict back, no event (in TorchRec too)."""
    got, expected = (module.transfer_tensors_to_cpu(values) for module in (deferrable_metrics, torchrec_deferrable))
    assert got[0] is values and expected[0] is values and got[1] is None and expected[1] is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="copies CUDA tensors")
def test_transfer_of_cuda_values_as_torchrec():
    values = {"ne": torch.rand(3, device="cuda"), "count": torch.arange(4, device="cuda"), "name": "click"}
    got, got_event = deferrable_metrics.transfer_tensors_to_cpu(values)
    expected, expected_event = torchrec_deferrable.transfer_tensors_to_cpu(values)
    got_event.synchronize()
    expected_event.synchronize()
    assert list(got) == list(expected) and got["name"] == "click"
    for key in ("ne", "count"):
        assert got[key].device.type == "cpu" and got[key].is_pinned() and got[key].dtype == expected[key].dtype
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"the tensors are on \['cpu', 'cuda:0'\]"):
        deferrable_metrics.transfer_tensors_to_cpu({"ne": values["ne"], "host": torch.ones(1)})
