"""TorchRec's torchrec.inference.model_packager: a PredictFactory, its configs and extra files as one torch.package.

    class MyPackager(PredictFactoryPackager):
        @classmethod
        def set_extern_modules(cls, pe): pe.extern(["numpy", "numpy.**"])
        @classmethod
        def set_mocked_modules(cls, pe): pe.mock(["matplotlib", "matplotlib.**"])

    MyPackager.save_predict_factory(MyPredictFactory, {"config.pkl": config}, "model.zip", {})

    # the server:  PackageImporter("model.zip").import_module("__module_loader").MODULE_FACTORY()
    # inside the factory's module:  load_pickle_config("config.pkl", MyConfig)

As TorchRec's: the factory's module and everything it imports are interned (copied into the package) except what
`set_extern_modules` leaves to the environment and `set_mocked_modules` stubs out; `sys` is extern; configs are
saved as text (str) or pickles under "__configs", extra files as text or bytes under "extra_files", and the
module "__module_loader" names the factory class (`MODULE_FACTORY`).

What differs: rectoolkit itself is extern (the serving environment imports its own installed rectoolkit; TorchRec's
interns torchrec). rectoolkit's dataclasses cannot run interned: with postponed annotations (`from __future__ import
annotations`), `dataclasses` looks their module up in sys.modules, where torch.package's copies are not ("'NoneType'
object has no attribute '__dict__'"). So `load_config_text` / `load_pickle_config` find the package they read from
through their caller: the nearest calling code loaded from a package.
"""

from __future__ import annotations

import abc
import sys
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Type, TypeVar, Union

import torch
import torch.package
from torch.package import PackageExporter

from rectoolkit.inference.modules import PredictFactory

__all__ = ["CONFIG_MODULE", "LOADER_CODE", "LOADER_FACTORY", "LOADER_MODULE", "PredictFactoryPackager",
           "load_config_text", "load_pickle_config"]

LOADER_MODULE = "__module_loader"
LOADER_FACTORY = "MODULE_FACTORY"
LOADER_CODE = f"""
import %PACKAGE%

{LOADER_FACTORY}=%PACKAGE%.%CLASS%
"""
CONFIG_MODULE = "__configs"
RECTOOLKIT_EXTERN = ["rectoolkit", "rectoolkit.**"]  # what the package takes from the serving environment

T = TypeVar("T")

try:
    import torch_package_importer  # (there inside a torch.package: the importer that loaded this copy)
except ImportError:
    torch_package_importer = None


def _importer() -> Any:
    """The PackageImporter of the nearest calling code loaded from a package (or of this module, if a package
    copied it in)."""
    if torch_package_importer is not None:
        return torch_package_importer
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__torch_package__"):  # (set by the PackageImporter on every module it loads)
            return frame.f_globals["__loader__"]
        frame = frame.f_back
    raise RuntimeError("load_config_text / load_pickle_config read the configs of the torch.package they run in: "
                       "call them from code loaded out of a package that PredictFactoryPackager saved "
                       "(PackageImporter(path).import_module('__module_loader')), not from a plain import")


def load_config_text(name: str) -> str:
    """The text config `name` saved with the package (save_predict_factory's `configs`)."""
    return _importer().load_text(CONFIG_MODULE, name)


def load_pickle_config(name: str, clazz: Type[T]) -> T:
    """The pickled config `name` saved with the package, checked to be a `clazz`."""
    loaded = _importer().load_pickle(CONFIG_MODULE, name)
    if not isinstance(loaded, clazz):
        raise TypeError(f"load_pickle_config({name!r}): the saved config is a {type(loaded).__name__}, not a "
                        f"{clazz.__name__}")
    return loaded


class PredictFactoryPackager:
    """Subclass it with `set_extern_modules(pe)` and `set_mocked_modules(pe)` (classmethods), then call
    `save_predict_factory`."""

    @classmethod
    @abc.abstractmethod
    def set_extern_modules(cls, pe: PackageExporter) -> None:
        """Declare the modules the package takes from the serving environment (`pe.extern([...])`)."""

    @classmethod
    @abc.abstractmethod
    def set_mocked_modules(cls, pe: PackageExporter) -> None:
        """Declare the modules the package replaces with stubs (`pe.mock([...])`)."""

    @classmethod
    def save_predict_factory(cls, predict_factory: Type[PredictFactory], configs: Dict[str, Any],
                             output: Union[str, Path, BinaryIO], extra_files: Dict[str, Union[str, bytes]],
                             loader_code: str = LOADER_CODE,
                             package_importer: Union[torch.package.Importer, List[torch.package.Importer]]
                             = torch.package.sys_importer) -> None:
        """Write `predict_factory`'s module (and what it imports), `configs` and `extra_files` to `output`."""
        for name, value in extra_files.items():
            if not isinstance(value, (str, bytes)):
                raise ValueError(f"save_predict_factory: extra file {name!r} is a {type(value).__name__}; give str "
                                 "(saved as text) or bytes")
        with PackageExporter(output, importer=package_importer) as pe:
            cls.set_extern_modules(pe)
            cls.set_mocked_modules(pe)
            pe.extern(RECTOOLKIT_EXTERN)
            pe.extern(["sys"])
            pe.intern("**")
            for name, value in extra_files.items():
                if isinstance(value, str):
                    pe.save_text("extra_files", name, value)
                else:
                    pe.save_binary("extra_files", name, value)
            cls._save_predict_factory(pe, predict_factory, configs, loader_code=loader_code)

    @classmethod
    def _save_predict_factory(cls, pe: PackageExporter, predict_factory: Type[PredictFactory],
                              configs: Dict[str, Any], loader_code: str = LOADER_CODE) -> None:
        # a factory loaded from a package has a "<torch_package_N>." prefix on its module: saved without it
        package_name = predict_factory.__module__
        if package_name.startswith("<torch_package_"):
            package_name = ".".join(package_name.split(".")[1:])
        code = loader_code.replace("%PACKAGE%", package_name).replace("%CLASS%", predict_factory.__name__)
        pe.save_source_string(module_name=LOADER_MODULE, src=code)
        for name, config in configs.items():
            if isinstance(config, str):
                pe.save_text(CONFIG_MODULE, name, config)
            else:
                pe.save_pickle(CONFIG_MODULE, name, config)
        pe.save_module(predict_factory.__module__)
