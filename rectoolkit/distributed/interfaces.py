"""TorchRec's interfaces in torchrec.distributed.types, for code that checks or extends them:

    isinstance(module, ShardedModule)       every sharded collection here (EmbeddingBagCollection, EmbeddingCollection,
                                            their quantized and managed-collision forms)
    isinstance(entry, ModuleShardingPlan)   every entry of a ShardingPlan (EmbeddingModuleShardingPlan)

A ShardedModule written for TorchRec (create_context, input_dist, compute, output_dist) runs here as it does there:
forward calls them in that order. The well-known resources and devices (ParameterStorage, ComputeDevice, ...),
`rank_device` and `get_tensor_size_bytes` are TorchRec's too.

    >>> rank_device("cpu", 3), rank_device("cuda", 1)
    (device(type='cpu'), device(type='cuda', index=1))
    >>> get_tensor_size_bytes(torch.zeros(4, 8, dtype=torch.float16))
    64
"""

from __future__ import annotations

import abc
from enum import Enum, unique
from typing import Any, Dict, Iterator, Optional, Type

import torch
from torch import nn

from rectoolkit.streamable import Multistreamable


class ParameterStorage(Enum):
    """Well-known physical resources a planner can constrain (TorchRec's)."""

    HBM = "hbm"  # GPU-attached memory
    DDR = "ddr"  # CPU-attached memory


class StorageUsageType(Enum):
    """Which sharder base estimates a module's storage (TorchRec's)."""

    BASE_QUANT = "BaseQuantEmbeddingSharder"
    BASE = "BaseEmbeddingSharder"
    DEFAULT = "ModuleSharder"


class ComputeDevice(Enum):
    """Well-known compute devices (TorchRec's)."""

    CUDA = "cuda"
    CPU = "cpu"
    MTIA = "mtia"


@unique
class ComputeKernel(Enum):
    """The base of TorchRec's compute-kernel enums (the embedding kernels are EmbeddingComputeKernel)."""

    DEFAULT = "default"


class PipelineType(Enum):
    """Known train pipeline types (TorchRec's)."""

    NONE = "none"
    TRAIN_BASE = "train_base"
    TRAIN_SPARSE_DIST = "train_sparse_dist"
    TRAIN_PREFETCH_SPARSE_DIST = "train_prefetch_sparse_dist"


class ShardingStrategy(Enum):
    """TorchRec's sharding strategies of DMPCollection (rectoolkit.distributed.two_dimensional). DEFAULT and
    PER_MODULE average the replicas in sync(); FULLY_SHARDED (weights reduce-scattered over the replica group each
    step) is not implemented."""

    DEFAULT = "default"
    PER_MODULE = "per_module"
    FULLY_SHARDED = "fully_sharded"


def rank_device(device_type: str, rank: int) -> torch.device:
    """The device a rank uses: the CPU for "cpu", else `<device_type>:<rank>`."""
    return torch.device("cpu") if device_type == "cpu" else torch.device(f"{device_type}:{rank}")


def get_tensor_size_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor's elements take (numel x element size)."""
    return t.numel() * t.element_size()


def compute_storage_usage(tensor: torch.Tensor, compute_device_type: str, compute_kernel: str,
                          storage_usage_type: StorageUsageType) -> Dict[str, int]:
    """TorchRec's storage estimate of a parameter: {"hbm" or "ddr": bytes}. Quantized tables (BASE_QUANT) add 4
    bytes a row (scale and bias); UVM kernels keep the bytes in DDR; otherwise cuda (and mtia, except quantized)
    means HBM, cpu DDR, any other device HBM."""
    tensor_bytes = get_tensor_size_bytes(tensor)
    device_storage = {"cuda": ParameterStorage.HBM, "cpu": ParameterStorage.DDR, "mtia": ParameterStorage.HBM}
    if storage_usage_type == StorageUsageType.BASE_QUANT:
        tensor_bytes += tensor.shape[0] * 4
        uvm_kernels = ("quant_uvm", "quant_uvm_caching")
        device_storage["mtia"] = ParameterStorage.DDR
    elif storage_usage_type == StorageUsageType.BASE:
        uvm_kernels = ("fused_uvm", "fused_uvm_caching")
    else:
        uvm_kernels = ()
    if compute_kernel in uvm_kernels:
        return {ParameterStorage.DDR.value: tensor_bytes}
    return {device_storage.get(compute_device_type, ParameterStorage.HBM).value: tensor_bytes}


class CacheStatistics(abc.ABC):
    """What a planner knows of a table's access pattern, to size a cache (TorchRec's abstract base; rectoolkit's
    planner reads the stats of rectoolkit.planner.stats instead)."""

    @property
    @abc.abstractmethod
    def expected_lookups(self) -> float:
        """Distinct ids expected in one global batch."""

    @abc.abstractmethod
    def expected_miss_rate(self, clf: float) -> float:
        """The miss rate for a cache of `clf` (load factor) of the rows: 1.0 at 0, 0.0 at 1."""

    @property
    @abc.abstractmethod
    def cacheability(self) -> float:
        """How hard the ids are to cache, whatever the cache size: 0 easy (high locality), 1 hard."""


class NullShardingContext(Multistreamable):
    """A sharding context that carries nothing."""

    def record_stream(self, stream: Any) -> None:
        pass


class NullShardedModuleContext(Multistreamable):
    """A sharded module's context that carries nothing (and takes no attributes)."""

    def record_stream(self, stream: Any) -> None:
        pass

    def __setattr__(self, key: str, value: Any) -> None:
        raise NotImplementedError(f"NullShardedModuleContext takes no attributes (got {key!r}); use a context "
                                  "class of your own")


class ShardedModule(nn.Module):
    """The interface of every model-parallel module (TorchRec's): data-parallel inputs and outputs, and in between
    `input_dist` -> `compute` -> `output_dist`, which `forward` calls in that order. rectoolkit's sharded collections
    are ShardedModules that run their groups in their own forward; a subclass written for TorchRec implements
    create_context, input_dist, compute and output_dist (and unsharded_module_type), as there."""

    def __init__(self, qcomm_codecs_registry: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        self._qcomm_codecs_registry = {} if qcomm_codecs_registry is None else qcomm_codecs_registry
        self.is_pipelined = False

    @property
    def qcomm_codecs_registry(self) -> Optional[Dict[str, Any]]:
        """CommOp name -> QuantizedCommCodecs of this module's collectives."""
        return self.__dict__.get("_qcomm_codecs_registry")

    @qcomm_codecs_registry.setter
    def qcomm_codecs_registry(self, registry: Optional[Dict[str, Any]]) -> None:
        self.__dict__["_qcomm_codecs_registry"] = registry

    def create_context(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.create_context: a ShardedModule subclass implements it")

    def input_dist(self, ctx: Any, *input: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.input_dist: a ShardedModule subclass implements it")

    def compute(self, ctx: Any, dist_input: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.compute: a ShardedModule subclass implements it")

    def output_dist(self, ctx: Any, output: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.output_dist: a ShardedModule subclass implements it")

    def prefetch(self, dist_input: Any, forward_stream: Any = None, ctx: Any = None) -> None:
        return None

    def compute_and_output_dist(self, ctx: Any, input: Any) -> Any:
        """compute, then output_dist of its result (override to start each output as soon as it is computed)."""
        return self.output_dist(ctx, self.compute(ctx, input))

    def forward(self, *input: Any, **kwargs: Any) -> Any:
        """input_dist (both of its awaitables waited), then compute_and_output_dist, as TorchRec's."""
        ctx = self.create_context()
        dist_input = self.input_dist(ctx, *input, **kwargs).wait().wait()
        return self.compute_and_output_dist(ctx, dist_input)

    def sharded_parameter_names(self, prefix: str = "") -> Iterator[str]:
        """The names of this module's parameters (this rank's shards), as named_parameters gives them."""
        for name, _ in self.named_parameters(prefix):
            yield name

    def unsharded_module_type(self) -> Type[nn.Module]:
        raise NotImplementedError(f"{type(self).__name__}.unsharded_module_type: a ShardedModule subclass "
                                  "implements it")

