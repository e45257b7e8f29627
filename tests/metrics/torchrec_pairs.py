"""Helpers the differential metric tests share: the same metric module built in TorchRec and in rectoolkit from one
config function, and the check that two compute() results agree key for key (order, shape, dtype, values)."""

import importlib

import torch


def assert_same_values(got, expected, rtol=1e-6, atol=1e-9, skip=lambda key: False):
    """The same keys in the same order, each value of the same shape and dtype and close (nan equal to nan)."""
    assert list(got) == list(expected)
    for key, value in expected.items():
        if skip(key):
            continue
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
        torch.testing.assert_close(got[key], value, rtol=rtol, atol=atol, equal_nan=True, msg=key)


def generate_both(make_config, batch_size):
    """[TorchRec's, rectoolkit's] RecMetricModule from `make_config(metrics_config_module)`, one rank, on CPU."""
    modules = []
    for library in ("torchrec", "rectoolkit"):
        package = importlib.import_module(f"{library}.metrics.metrics_config")
        generate = importlib.import_module(f"{library}.metrics.metric_module")
        modules.append(generate.generate_metric_module(generate.RecMetricModule, make_config(package),
                                                       batch_size=batch_size, world_size=1, my_rank=0,
                                                       state_metrics_mapping={}, device=torch.device("cpu")))
    return modules


def feed_both(modules, stream, tasks):
    """Update both modules with each (predictions, labels, weights[, required inputs]) of `stream`, as model outputs
    named `{task}_p`, `{task}_y`, `{task}_w` (and the required inputs' own names); the two compute() results."""
    for predictions, labels, weights, *required in stream:
        model_out = {f"{t}_{suffix}": source[t] for t in tasks
                     for suffix, source in (("p", predictions), ("y", labels), ("w", weights))}
        model_out.update(required[0] if required else {})
        for module in modules:
            module.update(model_out)
    return [dict(module.compute()) for module in modules]


def user_metrics(module, computation, namespace, tasks, mode, **kwargs):
    """[TorchRec's, rectoolkit's] instance of the same user code: a RecMetric written as TorchRec's docs write one,
    naming `{library}.metrics.{module}.{computation}` as its `_computation_class`, under MetricNamespace.<namespace>,
    one rank, tasks by name, compute mode by RecComputeMode name; kwargs: batch_size, window_size, its options."""
    metrics = []
    for library in ("torchrec", "rectoolkit"):
        rec_metric, config, names = (importlib.import_module(f"{library}.metrics.{name}")
                                     for name in ("rec_metric", "metrics_config", "metrics_namespace"))
        computation_class = getattr(importlib.import_module(f"{library}.metrics.{module}"), computation)

        class UserMetric(rec_metric.RecMetric):
            _namespace = getattr(names.MetricNamespace, namespace)
            _computation_class = computation_class

        metrics.append(UserMetric(world_size=1, my_rank=0, tasks=[config.RecTaskInfo(name=t) for t in tasks],
                                  compute_mode=getattr(config.RecComputeMode, mode), **kwargs))
    return metrics
