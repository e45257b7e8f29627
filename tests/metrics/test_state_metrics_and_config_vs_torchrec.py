"""metrics_config's RecMetricEnumBase, StateMetricEnum, BatchSizeStage, validate_batch_size_stages and ready-made
configs, and metric_module's StateMetric (a RecMetricModule's state metrics, from MetricsConfig.state_metrics), against
TorchRec 1.8."""

import dataclasses
import importlib

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

LIBRARIES = ("torchrec", "rectoolkit")


def _module(library, name):
    return importlib.import_module(f"{library}.metrics.{name}")


def test_enums_equal_torchrecs():
    theirs, ours = (_module(library, "metrics_config") for library in LIBRARIES)
    assert [(m.name, m.value, str(m)) for m in ours.StateMetricEnum] == \
        [(m.name, m.value, str(m)) for m in theirs.StateMetricEnum]
    for config in (theirs, ours):
        assert issubclass(config.RecMetricEnum, config.RecMetricEnumBase)
        assert str(config.RecMetricEnum.NE) == "ne"


def test_batch_size_stage_fields_equal_torchrecs():
    theirs, ours = (_module(library, "metrics_config").BatchSizeStage for library in LIBRARIES)
    assert [(f.name, f.default) for f in dataclasses.fields(ours)] == \
        [(f.name, f.default) for f in dataclasses.fields(theirs)]
    assert dataclasses.astuple(ours(512, None)) == dataclasses.astuple(theirs(512, None))


STAGES = [None, [], [(256, None)], [(256, 10), (512, None)], [(256, 10)], [(256, 10), (512, 20)],
          [(256, None), (512, 0)]]


@pytest.mark.parametrize("stages", STAGES, ids=str)
def test_validate_batch_size_stages_accepts_and_refuses_as_torchrec(stages):
    outcomes = []
    for library in LIBRARIES:
        config = _module(library, "metrics_config")
        built = None if stages is None else [config.BatchSizeStage(*stage) for stage in stages]
        try:
            config.validate_batch_size_stages(built)
            outcomes.append("accepted")
        except ValueError as error:
            outcomes.append("refused")
            assert library == "torchrec" or "max_iters=None" in str(error)  # ours says the fix
    assert outcomes[0] == outcomes[1]


def _state_metric_class(library):
    """A user's StateMetric, as TorchRec's docs write one (an optimizer's learning rate and step)."""
    base = _module(library, "metric_module").StateMetric

    class OptimizerState(base):
        def __init__(self):
            self.step = 0

        def get_metrics(self):
            self.step += 1
            return {"lr": torch.tensor(0.01 * self.step, dtype=torch.float64), "step": torch.tensor(self.step)}

    return OptimizerState


def _generate(library, state_metrics, mapping, batch_size_stages=None):
    config = _module(library, "metrics_config")
    metric_module = _module(library, "metric_module")
    task = config.RecTaskInfo(name="click")
    metrics_config = config.MetricsConfig(
        rec_tasks=[task], rec_metrics={config.RecMetricEnum.CTR: config.RecMetricDef(rec_tasks=[task], window_size=8)},
        state_metrics=[getattr(config.StateMetricEnum, name) for name in state_metrics])
    return metric_module.generate_metric_module(
        metric_module.RecMetricModule, metrics_config, batch_size=4, world_size=1, my_rank=0,
        state_metrics_mapping={getattr(config.StateMetricEnum, name): metric() for name, metric in mapping.items()},
        device=torch.device("cpu"), batch_size_stages=batch_size_stages)


@pytest.mark.parametrize("names", [["OPTIMIZERS"], ["OPTIMIZERS", "MODEL_CONFIGURATOR"]])
def test_state_metrics_reported_as_torchrec(names):
    modules = [_generate(library, names, {name: _state_metric_class(library) for name in names})
               for library in LIBRARIES]
    generator = torch.Generator().manual_seed(0)
    model_out = {"prediction": torch.rand(4, generator=generator), "label": torch.tensor([0.0, 1.0, 1.0, 0.0]),
                 "weight": torch.rand(4, generator=generator)}
    for _ in range(2):
        for module in modules:
            module.update(model_out)
        expected, got = (dict(module.compute()) for module in modules)
        assert list(got) == list(expected)
        for key, value in expected.items():
            assert got[key].dtype == value.dtype, key
            torch.testing.assert_close(got[key], value, msg=key)
    assert "optimizers-optimizers|lr" in got


def test_state_metric_missing_from_the_mapping_is_a_key_error_as_torchrec():
    for library in LIBRARIES:
        with pytest.raises(KeyError):
            _generate(library, ["OPTIMIZERS"], {})
    with pytest.raises(KeyError, match="state_metrics_mapping has no StateMetric"):
        _generate("rectoolkit", ["OPTIMIZERS"], {})


def test_invalid_batch_size_stages_refused_by_generate_metric_module_as_torchrec():
    for library in LIBRARIES:
        stage = _module(library, "metrics_config").BatchSizeStage
        with pytest.raises(ValueError, match="last stage should have max_iters = None"):
            _generate(library, [], {}, batch_size_stages=[stage(4, 10)])


def test_state_metrics_must_have_get_metrics():
    metric_module = _module("rectoolkit", "metric_module")
    with pytest.raises(TypeError, match=r"state_metrics\['optimizers-optimizers'\] is a dict, which has no "
                                        r"get_metrics\(\)"):
        metric_module.RecMetricModule(batch_size=4, world_size=1, state_metrics={"optimizers-optimizers": {}})


def _described(config):
    """A MetricsConfig as plain values (enums by their value) to compare across the libraries."""
    described = dataclasses.asdict(config)
    described["rec_metrics"] = {str(metric): value for metric, value in described["rec_metrics"].items()}
    described["rec_compute_mode"] = config.rec_compute_mode.name
    return described


@pytest.mark.parametrize("name", ["DefaultMetricsConfig", "EmptyMetricsConfig"])
def test_ready_made_configs_equal_torchrecs(name):
    theirs, ours = (getattr(_module(library, "metrics_config"), name) for library in LIBRARIES)
    assert _described(ours) == _described(theirs)


def test_default_config_generates_the_same_module():
    modules = []
    for library in LIBRARIES:
        metric_module = _module(library, "metric_module")
        modules.append(metric_module.generate_metric_module(
            metric_module.RecMetricModule, _module(library, "metrics_config").DefaultMetricsConfig, batch_size=4,
            world_size=1, my_rank=0, state_metrics_mapping={}, device=torch.device("cpu")))
    generator = torch.Generator().manual_seed(2)
    model_out = {"prediction": torch.rand(4, generator=generator), "label": torch.tensor([0.0, 1.0, 1.0, 0.0]),
                 "weight": torch.rand(4, generator=generator)}
    for module in modules:
        module.update(model_out)
    expected, got = (dict(module.compute()) for module in modules)
    assert list(got) == list(expected)
    for key, value in expected.items():
        if "throughput" in key and "total_examples" not in key:
            continue  # rates depend on the clock
        assert got[key].dtype == value.dtype, key
        torch.testing.assert_close(got[key], value, msg=key)
