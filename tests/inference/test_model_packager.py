"""TorchRec's model_packager: a PredictFactory packaged with its configs and extra files, loaded back by a fresh
process that has rectoolkit installed but not the factory's module, and served: the same output as the model built
directly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from rectoolkit.inference.model_packager import PredictFactoryPackager, load_pickle_config

FACTORY = '''
import torch
import rectoolkit as rtk
from rectoolkit.inference.model_packager import load_config_text, load_pickle_config
from rectoolkit.inference.modules import BatchingMetadata, PredictFactory, PredictModule, quantize_embeddings


class TablesConfig:
    def __init__(self, rows, dim, seed):
        self.rows, self.dim, self.seed = rows, dim, seed


def build(config, feature):
    torch.manual_seed(config.seed)
    table = rtk.EmbeddingBagConfig(name="t0", num_embeddings=config.rows, embedding_dim=config.dim,
                                   feature_names=[feature])
    return quantize_embeddings(torch.nn.Sequential(rtk.EmbeddingBagCollection([table])), dtype=torch.qint8,
                               inplace=True)


class Served(PredictModule):
    def predict_forward(self, batch):
        features = self.predict_module[0].embedding_bag_configs()[0].feature_names
        kjt = rtk.KeyedJaggedTensor(keys=features, values=batch["values"], lengths=batch["lengths"])
        return {"out": self.predict_module(kjt).values()}


def wrong_class():
    return load_pickle_config("tables.pkl", int)


class Factory(PredictFactory):
    def create_predict_module(self):
        return Served(build(load_pickle_config("tables.pkl", TablesConfig), load_config_text("feature.txt")),
                      device="cpu")

    def batching_metadata(self):
        return {"values": BatchingMetadata("sparse", "cpu", []), "lengths": BatchingMetadata("sparse", "cpu", [])}

    def result_metadata(self):
        return "dict_of_tensor"

    def run_weights_independent_tranformations(self, predict_module):
        return predict_module

    def run_weights_dependent_transformations(self, predict_module):
        return predict_module
'''

SERVER = '''
import sys
import torch
from torch.package import PackageImporter

importer = PackageImporter(sys.argv[1])
factory = importer.import_module("__module_loader").MODULE_FACTORY()
module = factory.create_predict_module()
out = module({"values": torch.tensor([1, 2, 3, 4, 30]), "lengths": torch.tensor([1, 3, 0, 1])})["out"]
torch.save(out, sys.argv[2])
try:
    importer.import_module("served_factory").wrong_class()
except TypeError as error:
    said = str(error)
print(importer.load_text("extra_files", "readme.txt"), importer.load_binary("extra_files", "blob").hex(),
      type(module.predict_module[0]).__module__, type(factory).__module__, said, sep="|")
'''


class Packager(PredictFactoryPackager):
    @classmethod
    def set_extern_modules(cls, pe):
        pe.extern(["numpy", "numpy.**"])

    @classmethod
    def set_mocked_modules(cls, pe):
        pe.mock(["matplotlib", "matplotlib.**"])


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    (tmp_path / "served_factory.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import served_factory

    yield served_factory
    sys.modules.pop("served_factory", None)


@pytest.mark.timeout(120)
def test_a_packaged_factory_serves_its_model_in_a_fresh_process(tmp_path, factory_module):
    config = factory_module.TablesConfig(rows=50, dim=8, seed=3)
    package = tmp_path / "model.zip"
    Packager.save_predict_factory(factory_module.Factory, {"tables.pkl": config, "feature.txt": "item"}, package,
                                  {"readme.txt": "two tables", "blob": b"\x01\x02"})
    expected = factory_module.Served(factory_module.build(config, "item"), device="cpu")(
        {"values": torch.tensor([1, 2, 3, 4, 30]), "lengths": torch.tensor([1, 3, 0, 1])})["out"]
    server_dir = tmp_path / "server"  # (a directory without the factory's module)
    server_dir.mkdir()
    (server_dir / "serve.py").write_text(SERVER)
    done = subprocess.run([sys.executable, "serve.py", str(package), str(tmp_path / "out.pt")], cwd=server_dir,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    readme, blob, collection_module, factory_module_name, said = done.stdout.strip().splitlines()[-1].split("|")
    assert torch.equal(torch.load(tmp_path / "out.pt"), expected) and expected.shape == (4, 8)
    assert (readme, blob) == ("two tables", "0102")
    # rectoolkit came from the environment, the factory's module from the package
    assert collection_module == "rectoolkit.quant.embedding_modules"
    assert factory_module_name.startswith("<torch_package_") and factory_module_name.endswith(">.served_factory")
    assert said == "load_pickle_config('tables.pkl'): the saved config is a TablesConfig, not a int"


def test_configs_outside_a_package_and_extra_files_of_other_types_are_refused(tmp_path, factory_module):
    with pytest.raises(RuntimeError, match="read the configs of the torch.package they run in"):
        load_pickle_config("tables.pkl", object)
    with pytest.raises(ValueError, match=r"extra file 'weights' is a dict; give str"):
        Packager.save_predict_factory(factory_module.Factory, {}, tmp_path / "model.zip", {"weights": {}})
    assert not (tmp_path / "model.zip").exists()
