"""TorchRec's sharders: what sharding types and compute kernels a collection supports.

TorchRec's planner and DistributedModelParallel take a list of sharders, one per module type they may shard.
rectoolkit shards every EmbeddingBagCollection and EmbeddingCollection it finds, so passing these is optional;
they exist so that TorchRec code runs unchanged, and they answer the same questions TorchRec's do. Their
`fused_params` set the shards' fused optimizer (rectoolkit.distributed.fused_params), and `shard()` shards one
collection by its part of a plan:

    sharded = EmbeddingBagCollectionSharder(fused_params={"learning_rate": 0.02}).shard(ebc, plan.plan[""], env)

    >>> EmbeddingCollectionSharder().sharding_types("cuda")
    ['data_parallel', 'table_wise', 'column_wise', 'row_wise']
    >>> EmbeddingCollectionSharder().compute_kernels("row_wise", "cpu")
    ['fused']
"""

from __future__ import annotations

import abc
from typing import Any, Dict, Generic, List, Mapping, Optional, Type, TypeVar

import torch
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.fbgemm_qcomm_codec import QuantizedCommCodecs, check_qcomm_codecs_registry
from rectoolkit.kernels.fused_optimizers import FusedOptimizerConfig

from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.plan.types import CPU_KERNELS, CUDA_KERNELS, EmbeddingComputeKernel, ShardingType

# TorchRec's lists of the kernels its planner may pick for a model-parallel table, in its order, without the
# key-value and virtual-table kernels (rectoolkit has none). A plan may still ask for "dense" (plain weights): it runs
# here, as in TorchRec, whose sharders do not offer it either ("re-enable model parallel and dense").
_TRAINING_KERNELS = {
    "cuda": [EmbeddingComputeKernel.FUSED, EmbeddingComputeKernel.FUSED_UVM, EmbeddingComputeKernel.FUSED_UVM_CACHING],
    "cpu": [EmbeddingComputeKernel.FUSED],
}
assert set(_TRAINING_KERNELS["cuda"]) == set(CUDA_KERNELS) and _TRAINING_KERNELS["cpu"] == list(CPU_KERNELS)


M = TypeVar("M", bound=nn.Module)


class ModuleSharder(abc.ABC, Generic[M]):
    """TorchRec's base of every sharder (torchrec.distributed.types.ModuleSharder): `shard()` turns one module into
    its sharded form; the rest answer what can be sharded and how. Subclass it for a sharder of your own: give
    `module_type` and `shard`; the defaults below are TorchRec's (every parameter shardable, data parallel only).

        >>> class Replicate(ModuleSharder):
        ...     module_type = torch.nn.Linear
        ...     def shard(self, module, params, env, device=None, module_fqn=None):
        ...         return module
        >>> sorted(Replicate().shardable_parameters(torch.nn.Linear(2, 3)))
        ['bias', 'weight']
        >>> Replicate().storage_usage(torch.empty(4, 2), "cpu", "dense")
        {'ddr': 32}
        >>> ModuleSharder[torch.nn.Module] is not None  # TorchRec's type hints subscript it
        True
    """

    def __init__(self, qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None) -> None:
        # the output exchanges' wire precisions: None, or a registry made by get_qcomm_codecs_registry
        self._qcomm_codecs_registry = check_qcomm_codecs_registry(qcomm_codecs_registry, type(self).__name__)

    @abc.abstractmethod
    def shard(self, module: nn.Module, params: Mapping[str, Any], env: Any, device: Optional[torch.device] = None,
              module_fqn: Optional[str] = None) -> nn.Module:
        """The sharded form of `module` by its part of the plan (table or parameter name -> ParameterSharding)."""

    @property
    @abc.abstractmethod
    def module_type(self) -> Type[nn.Module]:
        """The module class this sharder shards."""

    @property
    def qcomm_codecs_registry(self) -> Optional[Dict[str, QuantizedCommCodecs]]:
        return self._qcomm_codecs_registry

    def shardable_parameters(self, module: nn.Module) -> Dict[str, nn.Parameter]:
        """The parameters a plan may shard, by the names the plan uses."""
        return dict(module.named_parameters())

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return [ShardingType.DATA_PARALLEL.value]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        return ["default"]

    def storage_usage(self, tensor: torch.Tensor, compute_device_type: str, compute_kernel: str) -> Dict[str, int]:
        """Bytes of `tensor` by where it is stored: "hbm" on accelerators, "ddr" on CPU."""
        if compute_device_type not in ("cuda", "cpu", "mtia"):
            raise ValueError(f"storage_usage: compute_device_type {compute_device_type!r}; use cuda, cpu or mtia")
        where = "ddr" if compute_device_type == "cpu" else "hbm"
        return {where: tensor.element_size() * tensor.nelement()}


class EmbeddingBagCollectionSharder(ModuleSharder):
    """Shards EmbeddingBagCollection: all seven sharding types.

    Args:
        fused_params: the shards' fused optimizer, TorchRec's keys ("optimizer", "learning_rate", "eps", "beta1",
            "beta2", "weight_decay", "gradient_clipping", "max_gradient", "momentum", "weight_decay_mode"), and
            TorchRec's per-table options for every table ("stochastic_rounding", "output_dtype",
            "bounds_check_mode", "enforce_hbm", the cache keys: rectoolkit.distributed.fused_params); other keys
            are refused, naming them. None: TorchRec's default, fused SGD with lr 0.01 (or what
            `_apply_optimizer_in_backward` or the collection itself set).
        qcomm_codecs_registry: the wire precisions of the shards' output exchanges, from TorchRec's
            `get_qcomm_codecs_registry(QCommsConfig(...))` (rectoolkit.distributed.fbgemm_qcomm_codec); None: float32.
    """

    module_type: Type[nn.Module] = EmbeddingBagCollection
    # TorchRec's order (its CUDA list; on CPU TorchRec 1.8 offers the first four, rectoolkit runs all seven there)
    _types = [ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
              ShardingType.TABLE_COLUMN_WISE, ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD]

    def __init__(self, fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
                 sharded_module_order_overwrite: Optional[List[str]] = None) -> None:
        super().__init__(qcomm_codecs_registry)
        if sharded_module_order_overwrite is not None:
            raise NotImplementedError(
                f"{type(self).__name__}(sharded_module_order_overwrite={sharded_module_order_overwrite!r}): TorchRec "
                "orders its sharded output's keys by sharding type and this reorders them; rectoolkit's sharded "
                "output always lists the keys in the collection's own order; leave it None")
        if fused_params is not None:
            FusedOptimizerConfig.from_fused_params(fused_params)  # refuse unknown keys now, not at shard()
        self._fused_params = dict(fused_params) if fused_params is not None else None

    @property
    def fused_params(self) -> Optional[Dict[str, Any]]:
        return self._fused_params

    def shard(self, module: nn.Module, params: Mapping[str, Any], env: Any, device: Optional[torch.device] = None,
              module_fqn: Optional[str] = None) -> nn.Module:
        """TorchRec's `sharder.shard(module, plan.plan[path], env, device)`: the sharded collection (this rank's
        shards). `env` is a ShardingEnv or a process group; `device` (default: env's) is where the shards live;
        `module_fqn`, the collection's path in its model, is kept as `sharded.module_fqn`."""
        from rectoolkit.distributed import sharded_ebc, sharded_ec

        if not isinstance(module, self.module_type):
            raise TypeError(f"{type(self).__name__}.shard: got a {type(module).__name__}, this sharder shards "
                            f"{self.module_type.__name__}")
        if not isinstance(env, ShardingEnv):
            env = ShardingEnv.from_process_group(env, device=device)
        elif device is not None and torch.device(device) != env.device:
            env = ShardingEnv(env.world_size, env.rank, env.pg, local_world_size=env.local_world_size,
                              device=torch.device(device))
        shard = (sharded_ebc.shard_embedding_bag_collection if self.module_type is EmbeddingBagCollection
                 else sharded_ec.shard_embedding_collection)
        sharded = shard(module, dict(params), env, fused_params=self._fused_params, torchrec_default_optimizer=True,
                        qcomm_codecs_registry=self._qcomm_codecs_registry)
        sharded.module_fqn = module_fqn  # the collection's path in its model ("" or None: the model itself)
        return sharded

    def shardable_parameters(self, module: nn.Module) -> Dict[str, nn.Parameter]:
        """Table name -> its weight, the names a plan uses."""
        return {name.split(".")[0]: param for name, param in module.embedding_bags.named_parameters()}

    def sharding_types(self, compute_device_type: str) -> List[str]:
        _check_device(compute_device_type)
        return [t.value for t in self._types]

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        _check_device(compute_device_type)
        if ShardingType(sharding_type) not in self._types:
            raise ValueError(f"{type(self).__name__}: sharding type {sharding_type!r} is not supported; "
                             f"choose from {self.sharding_types(compute_device_type)}")
        if ShardingType(sharding_type) == ShardingType.DATA_PARALLEL:
            return [EmbeddingComputeKernel.DENSE.value]
        return [k.value for k in _TRAINING_KERNELS[compute_device_type]]


class EmbeddingCollectionSharder(EmbeddingBagCollectionSharder):
    """Shards EmbeddingCollection (sequence embeddings): table-, column-, row-wise and data parallel."""

    module_type = EmbeddingCollection
    _types = [ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE]

    def __init__(self, fused_params: Optional[Dict[str, Any]] = None,
                 qcomm_codecs_registry: Optional[Dict[str, QuantizedCommCodecs]] = None,
                 use_index_dedup: bool = False) -> None:
        """TorchRec's arguments; `use_index_dedup=True` (send each distinct id once, a speed switch in TorchRec) is
        refused: rectoolkit sends the ids as given."""
        super().__init__(fused_params, qcomm_codecs_registry)
        if use_index_dedup:
            raise NotImplementedError(f"{type(self).__name__}(use_index_dedup=True): rectoolkit's sharded "
                                      "EmbeddingCollection sends every id as given (outputs are the same either way); "
                                      "leave it False")

    def shardable_parameters(self, module: nn.Module) -> Dict[str, nn.Parameter]:
        """Table name -> its weight, the names a plan uses."""
        return {name.split(".")[0]: param for name, param in module.embeddings.named_parameters()}


def _check_device(compute_device_type: str) -> None:
    if compute_device_type not in _TRAINING_KERNELS:
        raise ValueError(f"compute_device_type {compute_device_type!r}: use 'cuda' or 'cpu'")
