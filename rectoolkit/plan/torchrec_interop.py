"""Convert plans to and from TorchRec's ShardingPlan (TorchRec is imported only when these are called).

`to_torchrec(plan)` gives a plan TorchRec's DistributedModelParallel accepts; `from_torchrec(plan)` reads
one made by TorchRec's planner, so our reports can inspect it. The round trip is lossless. TorchRec keeps
no shards for DATA_PARALLEL tables; from_torchrec rebuilds the replicas from `tables` (or leaves them out).

    to_torchrec(plan)                      # -> torchrec.distributed.types.ShardingPlan
    from_torchrec(torchrec_plan, tables)   # -> rectoolkit ShardingPlan
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from rectoolkit.plan.constructors import placement
from rectoolkit.plan.types import CacheParams, EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan, ShardingType, ShardMetadata
from rectoolkit.plan.validation import validate_plan


def _torchrec():
    try:
        from torchrec.distributed import types as tr_types
        from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
        from torch.distributed._shard.metadata import ShardMetadata as TorchShardMetadata
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("TorchRec interop needs torchrec: pip install 'rectoolkit[torchrec]' and torchrec") from error
    return tr_types, EnumerableShardingSpec, TorchShardMetadata


def to_torchrec(plan: ShardingPlan) -> Any:
    """A torchrec.distributed.types.ShardingPlan with the same types, kernels, ranks, shards and cache load factors."""
    tr_types, EnumerableShardingSpec, TorchShardMetadata = _torchrec()
    from torchrec.distributed.types import CacheParams as TorchRecCacheParams

    modules: Dict[str, Any] = {}
    for path, name, ps in plan.items():
        spec = None
        if ps.sharding_type != ShardingType.DATA_PARALLEL.value:
            spec = EnumerableShardingSpec([
                TorchShardMetadata(shard_offsets=list(s.shard_offsets), shard_sizes=list(s.shard_sizes),
                                   placement=s.placement)
                for s in ps.shards
            ])
        module = modules.setdefault(path, tr_types.EmbeddingModuleShardingPlan())
        module[name] = tr_types.ParameterSharding(
            sharding_type=ps.sharding_type, compute_kernel=ps.compute_kernel,
            ranks=list(ps.ranks) if ps.ranks is not None else None, sharding_spec=spec,
            cache_params=_torchrec_cache_params(ps, TorchRecCacheParams), enforce_hbm=ps.enforce_hbm,
            stochastic_rounding=ps.stochastic_rounding, bounds_check_mode=ps.bounds_check_mode,
            output_dtype=_torchrec_data_type(ps.output_dtype))
    return tr_types.ShardingPlan(modules)


def from_torchrec(torchrec_plan: Any, tables: Any = None, compute_device: Optional[str] = None,
                  local_world_size: Optional[int] = None) -> ShardingPlan:
    """Our ShardingPlan from TorchRec's. DATA_PARALLEL replicas need the table shapes: pass `tables`
    (configs, DataFrame, module, or {(path, name): (rows, cols)}); without them those tables get no shards.
    Replica placements use `compute_device` (default: the device type of the plan's other shards, else cpu)
    and `local_world_size` (default: all ranks on one host) for the local device index."""
    shapes: Optional[Dict] = None
    if tables is not None:
        from rectoolkit.plan.validation import _shapes

        shapes = _shapes(tables)
    if compute_device is None:
        compute_device = _device_type_of(torchrec_plan)
    modules: Dict[str, EmbeddingModuleShardingPlan] = {}
    for path, module_plan in torchrec_plan.plan.items():
        module = EmbeddingModuleShardingPlan()
        for name, tr in module_plan.items():
            spec = getattr(tr, "sharding_spec", None)
            shards = []
            if spec is not None and getattr(spec, "shards", None) is not None:
                shards = [ShardMetadata(list(s.shard_offsets), list(s.shard_sizes), s.placement) for s in spec.shards]
            elif tr.sharding_type == ShardingType.DATA_PARALLEL.value and shapes is not None:
                rows, cols = shapes[(path, name)]
                ranks = list(tr.ranks or [])
                local = local_world_size or (max(ranks) + 1 if ranks else 1)
                shards = [ShardMetadata([0, 0], [rows, cols], placement(compute_device, r, local)) for r in ranks]
            cache = getattr(tr, "cache_params", None)
            load_factor = getattr(cache, "load_factor", None) if cache is not None else None
            module[name] = ParameterSharding(
                tr.sharding_type, tr.compute_kernel, list(tr.ranks) if tr.ranks is not None else None, shards=shards,
                cache_load_factor=load_factor, cache_params=_our_cache_params(cache), enforce_hbm=getattr(tr, "enforce_hbm", None),
                stochastic_rounding=getattr(tr, "stochastic_rounding", None),
                bounds_check_mode=getattr(tr, "bounds_check_mode", None), output_dtype=getattr(tr, "output_dtype", None))
        modules[path] = module
    plan = ShardingPlan(modules)
    if shapes is not None:  # without the shapes, DATA_PARALLEL tables have no shards yet: DMP validates them
        validate_plan(plan, shapes, source="the TorchRec plan")
    return plan


CACHE_FIELDS = tuple(field.name for field in dataclasses.fields(CacheParams))


def _torchrec_cache_params(ps: ParameterSharding, torchrec_cache_params: Any) -> Any:
    """TorchRec's CacheParams with every field of ours (or just the load factor the planner chose)."""
    cache = ps.cache_params
    if cache is None:
        return torchrec_cache_params(load_factor=ps.cache_load_factor) if ps.cache_load_factor is not None else None
    if isinstance(cache, torchrec_cache_params):
        return cache
    return torchrec_cache_params(**{field: getattr(cache, field, None) for field in CACHE_FIELDS})


def _our_cache_params(cache: Any) -> Optional[CacheParams]:
    """Ours from TorchRec's; None when it holds only a load factor (ParameterSharding.cache_load_factor has it)."""
    if cache is None or all(getattr(cache, field, None) is None for field in CACHE_FIELDS if field != "load_factor"):
        return None
    return CacheParams(**{field: getattr(cache, field, None) for field in CACHE_FIELDS})


def _torchrec_data_type(data_type: Any) -> Any:
    """TorchRec's DataType member of the same name (rectoolkit's DataType mirrors it)."""
    if data_type is None:
        return None
    from torchrec.types import DataType

    return DataType[getattr(data_type, "name", str(data_type))]


def _device_type_of(torchrec_plan: Any) -> str:
    for module_plan in torchrec_plan.plan.values():
        for tr in module_plan.values():
            spec = getattr(tr, "sharding_spec", None)
            for shard in getattr(spec, "shards", None) or []:
                device = str(shard.placement).split("/", 1)[-1]
                return device.split(":")[0]
    return "cpu"


