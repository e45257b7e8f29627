"""The window AUCs (AUC, AUPRC, RAUC) come back in TorchRec's float32 (computed in float64 here, then rounded),
the other values in float64, with TorchRec's keys and shapes, in both compute modes."""

import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

pytestmark = pytest.mark.torchrec

BATCH = 16


def _metric(library, module, name, mode):
    config = importlib.import_module(f"{library}.metrics.metrics_config")
    cls = getattr(importlib.import_module(f"{library}.metrics.{module}"), name)
    return cls(world_size=1, my_rank=0, batch_size=BATCH, tasks=[config.RecTaskInfo(name="click")],
               window_size=3 * BATCH, compute_mode=getattr(config.RecComputeMode, mode))


@pytest.mark.parametrize("mode", ["UNFUSED_TASKS_COMPUTATION", "FUSED_TASKS_COMPUTATION"])
@pytest.mark.parametrize("module, name", [("auc", "AUCMetric"), ("auprc", "AUPRCMetric"), ("rauc", "RAUCMetric"),
                                          ("ne", "NEMetric")])
def test_values_come_back_in_torchrecs_dtype_and_shape(module, name, mode):
    generator = torch.Generator().manual_seed(5)
    ours, theirs = _metric("rectoolkit", module, name, mode), _metric("torchrec", module, name, mode)
    for _ in range(4):
        predictions, weights = torch.rand(BATCH, generator=generator), torch.rand(BATCH, generator=generator)
        labels = (torch.rand(BATCH, generator=generator) > 0.5).float()
        for metric in (ours, theirs):
            metric.update(predictions={"click": predictions}, labels={"click": labels}, weights={"click": weights})
    mine, reference = ours.compute(), theirs.compute()
    assert list(mine) == list(reference)
    for key, value in reference.items():
        assert (mine[key].dtype, mine[key].shape) == (value.dtype, value.shape), key
        torch.testing.assert_close(mine[key], value, rtol=1e-6, atol=1e-7, msg=key)
