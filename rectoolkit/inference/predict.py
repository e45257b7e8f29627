"""TorchRec's serving interfaces (`torchrec.inference.modules`): `PredictModule`, the nn.Module a model server
calls with a dict of input tensors, and `PredictFactory`, the class a user subclasses to tell the packager how to
build it, batch its inputs (`BatchingMetadata`) and what it returns.

    >>> import torch
    >>> class Doubler(PredictModule):
    ...     def predict_forward(self, batch):
    ...         return {"out": self.predict_module(batch["x"])}
    >>> module = Doubler(torch.nn.Linear(2, 2, bias=False), device="cpu")
    >>> module.predict_module.training, sorted(module.state_dict())  # eval mode; the model's own keys
    (False, ['weight'])
    >>> module({"x": torch.ones(1, 2)})["out"].requires_grad  # forward runs under torch.inference_mode
    False
    >>> BatchingMetadata(type="dense", device="cpu", pinned=[])
    BatchingMetadata(type='dense', device='cpu', pinned=[])
"""

from __future__ import annotations

import abc
import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

import torch
from torch import nn


@dataclass
class QualNameMetadata:
    """Extra information for running one method (qualname) of the served model."""

    need_preproc: bool


@dataclass
class BatchingMetadata:
    """How the server batches one input: its `type` (e.g. "dense", "sparse"), the `device` it goes to ("cpu" or
    "cuda") and the tensor suffixes to deserialize into pinned memory ("" pins the tensor itself)."""

    type: str
    device: str
    pinned: List[str]


class PredictFactory(abc.ABC):
    """Builds the model served at inference time, with its learned weights; subclass it and implement the
    abstract methods (as TorchRec's)."""

    @abc.abstractmethod
    def create_predict_module(self) -> nn.Module:
        """The model to serve (sharded, weights allocated)."""

    @abc.abstractmethod
    def batching_metadata(self) -> Dict[str, BatchingMetadata]:
        """Input name -> how the server batches it."""

    def batching_metadata_json(self) -> str:
        return json.dumps({key: asdict(value) for key, value in self.batching_metadata().items()})

    @abc.abstractmethod
    def result_metadata(self) -> str:
        """The result type, by which the server splits results per request."""

    @abc.abstractmethod
    def run_weights_independent_tranformations(self, predict_module: nn.Module) -> nn.Module:
        """Transformations that do not read the weights (tracing, splitting the model). TorchRec's spelling."""

    @abc.abstractmethod
    def run_weights_dependent_transformations(self, predict_module: nn.Module) -> nn.Module:
        """Transformations that read the weights (lowering to a backend)."""

    def qualname_metadata(self) -> Dict[str, QualNameMetadata]:
        return {}

    def qualname_metadata_json(self) -> str:
        return json.dumps({key: asdict(value) for key, value in self.qualname_metadata().items()})

    def model_inputs_data(self) -> Dict[str, Any]:
        """Data for generating benchmark inputs."""
        return {}


class PredictModule(nn.Module):
    """A served model: subclass it and override `predict_forward(batch)`, which turns the server's dict of input
    tensors into the model's inputs and its outputs into the result. forward runs it under torch.inference_mode;
    the wrapped model is put in eval mode, and state_dict is its own (no prefix).

    `device`: the device forward runs on. None: TorchRec takes the current CUDA device at the first call; here
    that, or "cpu" on a machine without CUDA (TorchRec's fails there)."""

    def __init__(self, module: nn.Module, device: Optional[str] = None) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"PredictModule wraps an nn.Module (the model to serve), got a {type(module).__name__}")
        self._module: nn.Module = module
        self._device: Optional[torch.device] = torch.device(device) if device else None
        self._module.eval()

    @property
    def predict_module(self) -> nn.Module:
        return self._module

    @abc.abstractmethod
    def predict_forward(self, batch: Dict[str, torch.Tensor]) -> Any:
        """The model's output for the server's batch (a dict of input tensors)."""

    def forward(self, batch: Dict[str, torch.Tensor]) -> Any:
        if self._device is None:
            self._device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                            else torch.device("cpu"))
        with torch.inference_mode():
            return self.predict_forward(batch)

    def state_dict(self, destination: Optional[Dict[str, Any]] = None, prefix: str = "",  # type: ignore[override]
                   keep_vars: bool = False) -> Dict[str, Any]:
        return self._module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)


__all__ = ["BatchingMetadata", "PredictFactory", "PredictModule", "QualNameMetadata"]
