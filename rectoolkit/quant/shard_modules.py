"""TorchRec's shard_modules (torchrec.distributed.shard): replace a model's embedding collections by sharded ones.

    sharded_model = shard_modules(model, env=ShardingEnv.from_process_group(pg))   # planned here, or plan=...

Unlike DistributedModelParallel, nothing else is done: no DDP for the dense part, no fused optimizer gathered
for the model. Collections are found by their sharders' module types (default: every rectoolkit collection,
float and quantized); the model itself may be one (then the sharded collection is returned, not the model).
It lives here, above rectoolkit.distributed, because its default sharders include the quantized one;
rectoolkit.distributed.shard re-exports it at TorchRec's path.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Type

import torch
import torch.distributed as dist
from torch import nn

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
from rectoolkit.plan.constructors import ParameterShardingGenerator, get_device_type, get_local_size
from rectoolkit.plan.types import EmbeddingModuleShardingPlan, ModuleShardingPlan, ShardingPlan
from rectoolkit.quant.sharding import QuantEmbeddingBagCollectionSharder, QuantEmbeddingCollectionSharder


def get_default_sharders() -> List[Any]:
    """A sharder for each collection rectoolkit shards: float and quantized, bags and sequences, feature-processed
    and managed-collision ones (TorchRec's list and order, less the fused and quantized managed-collision
    collections rectoolkit does not have)."""
    from rectoolkit.distributed.fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
    from rectoolkit.distributed.mc_embedding import ManagedCollisionEmbeddingCollectionSharder
    from rectoolkit.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder(), FeatureProcessedEmbeddingBagCollectionSharder(),
            EmbeddingCollectionSharder(), QuantEmbeddingBagCollectionSharder(), QuantEmbeddingCollectionSharder(),
            ManagedCollisionEmbeddingBagCollectionSharder(), ManagedCollisionEmbeddingCollectionSharder()]


def shard_modules(module: nn.Module, env: Optional[ShardingEnv] = None, device: Optional[torch.device] = None,
                  plan: Optional[ShardingPlan] = None, sharders: Optional[List[Any]] = None,
                  init_params: bool = False) -> nn.Module:
    """Shard every collection of `module` that a sharder handles, in place; returns `module` (or the sharded
    collection when `module` is one). `plan` None: planned here (EmbeddingShardingPlanner on env's world).
    `init_params` is TorchRec's switch to materialize meta weights: rectoolkit always does (shards of a meta
    collection are initialized with each table's init_fn), so True and False give the same."""
    return _shard_modules(module, env, device, plan, sharders, init_params)


def _shard_modules(module: nn.Module, env: Optional[ShardingEnv] = None, device: Optional[torch.device] = None,
                   plan: Optional[ShardingPlan] = None, sharders: Optional[List[Any]] = None,
                   init_params: bool = False, planner: Any = None) -> nn.Module:
    """shard_modules, with TorchRec's extra `planner` (used when no plan is given)."""
    if isinstance(env, dict):
        raise NotImplementedError("shard_modules(env={path: ShardingEnv}): hybrid sharding over several groups is "
                                  "not implemented in rectoolkit; pass one ShardingEnv")
    if env is None:
        if not dist.is_initialized():
            raise RuntimeError("shard_modules: no env given and torch.distributed is not initialized; call "
                               "dist.init_process_group first or pass env=ShardingEnv.from_local(1, 0)")
        env = ShardingEnv.from_process_group(dist.GroupMember.WORLD, device=device)
    if device is not None and torch.device(device) != env.device:
        env = ShardingEnv(env.world_size, env.rank, env.pg, local_world_size=env.local_world_size,
                              device=torch.device(device))
    sharders = get_default_sharders() if sharders is None else list(sharders)
    by_type = {sharder.module_type: sharder for sharder in sharders}
    if plan is None:
        if planner is None:
            from rectoolkit.planner import EmbeddingShardingPlanner, Topology  # the planner imports this package

            planner = EmbeddingShardingPlanner(topology=Topology(
                world_size=env.world_size, compute_device=env.device.type, local_world_size=env.local_world_size))
        # the planner gives quantized collections' tables kernel "quant" (and no DATA_PARALLEL), as TorchRec's does
        plan = planner.collective_plan(module, None, env.pg) if env.pg is not None else planner.plan(module, None)
    if type(module) in by_type:
        return by_type[type(module)].shard(module, _module_plan(plan, ""), env, env.device, "")
    for path, child in list(module.named_modules()):
        if path and type(child) in by_type:
            module_plan = plan.get_plan_for_module(path)
            if module_plan is None:
                continue  # TorchRec leaves a collection the plan does not name as it is
            parent_path, _, name = path.rpartition(".")
            parent = module.get_submodule(parent_path) if parent_path else module
            setattr(parent, name, by_type[type(child)].shard(child, module_plan, env, env.device, path))
    return module


def shard(module: nn.Module, plan: Any, env: Optional[ShardingEnv] = None, device: Optional[torch.device] = None,
          sharder: Any = None) -> nn.Module:
    """TorchRec's `torchrec.distributed.shard.shard`: the sharded form of one collection, by `plan`:

        sharded = shard(ebc, row_wise())                                  # one generator for every table
        sharded = shard(ebc, {"t0": table_wise(rank=0), "t1": row_wise()})  # generators (or ParameterShardings)
        sharded = shard(ebc, construct_module_sharding_plan(ebc, ...))     # a module plan as it is

    `env` None: the default process group's; `device` None: the current CUDA device when there is one, else cpu
    (TorchRec's defaults); `sharder` None: the collection type's default sharder. Generators are run as TorchRec
    runs them: (parameter, TorchRec's local size, world size, device type, sharder)."""
    sharder = _sharder_for(module, sharder, "shard")
    if env is None:
        if not dist.is_initialized():
            raise RuntimeError("shard: no env given and torch.distributed is not initialized; call "
                               "dist.init_process_group first or pass env=ShardingEnv.local()")
        if device is None:
            device = torch.device(torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        env = ShardingEnv.from_process_group(dist.GroupMember.WORLD, device=torch.device(device))
    device = torch.device(device) if device is not None else env.device
    if not isinstance(plan, ModuleShardingPlan):
        shardable = sharder.shardable_parameters(module)
        if callable(plan):
            plan = {name: plan for name in shardable}
        if not isinstance(plan, Mapping):
            raise TypeError(f"shard: plan must be a ModuleShardingPlan, a dict of table -> ParameterSharding or "
                            f"generator, or one generator; got a {type(plan).__name__}")
        unknown = [name for name in plan if name not in shardable]
        if unknown:
            raise ValueError(f"shard: the plan names {unknown}, which are not tables of the "
                             f"{type(module).__name__} (tables: {list(shardable)})")
        local_size = get_local_size(env.world_size)
        plan = EmbeddingModuleShardingPlan(
            (name, sharding(shardable[name], local_size, env.world_size, device.type, sharder)
             if callable(sharding) else sharding) for name, sharding in plan.items())
    return sharder.shard(module, plan, env, device)


def _module_plan(plan: ShardingPlan, path: str):
    module_plan = plan.get_plan_for_module(path)
    if module_plan is None:
        raise ValueError(f"shard_modules: the plan has no entry for the module at {path!r}; it has {list(plan.plan)}")
    return module_plan


def get_module_to_default_sharders() -> Dict[Type[nn.Module], Any]:
    """Module class -> its default sharder (TorchRec's torchrec.distributed.sharding_plan function).

    >>> from rectoolkit import EmbeddingBagCollection
    >>> type(get_module_to_default_sharders()[EmbeddingBagCollection]).__name__
    'EmbeddingBagCollectionSharder'
    """
    return {sharder.module_type: sharder for sharder in get_default_sharders()}


def _sharder_for(module: nn.Module, sharder: Any, caller: str) -> Any:
    if sharder is None:
        sharder = get_module_to_default_sharders().get(type(module))
        if sharder is None:
            known = sorted(cls.__name__ for cls in get_module_to_default_sharders())
            raise ValueError(f"{caller}: no default sharder for a {type(module).__name__}; shard one of {known}, "
                             "or pass sharder=")
    elif not isinstance(module, sharder.module_type):
        raise TypeError(f"{caller}: {type(sharder).__name__} shards {sharder.module_type.__name__}, "
                        f"got a {type(module).__name__}; pass its sharder")
    return sharder


def apply_to_all(module: nn.Module, parameter_sharding_generator: ParameterShardingGenerator,
                 sharder: Any = None) -> Dict[str, ParameterShardingGenerator]:
    """The same generator for every shardable table of `module`: the second argument of
    construct_module_sharding_plan.

    >>> from rectoolkit import EmbeddingBagCollection, EmbeddingBagConfig
    >>> from rectoolkit.plan.constructors import row_wise
    >>> ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=4, num_embeddings=8,
    ...     feature_names=[n]) for n in ("a", "b")])
    >>> sorted(apply_to_all(ebc, row_wise()))
    ['a', 'b']
    """
    sharder = _sharder_for(module, sharder, "apply_to_all")
    return {name: parameter_sharding_generator for name in sharder.shardable_parameters(module)}


def construct_module_sharding_plan(module: nn.Module, per_param_sharding: Mapping[str, ParameterShardingGenerator],
                                   sharder: Any = None, local_size: Optional[int] = None,
                                   world_size: Optional[int] = None, device_type: Optional[str] = None,
                                   ) -> EmbeddingModuleShardingPlan:
    """TorchRec's hand-written plan of one collection: table name -> a generator (`table_wise(rank=0)`,
    `row_wise()`, ... from rectoolkit.plan.constructors), for every shardable table of `module`.

    `world_size` defaults to the process group's, `local_size` to TorchRec's (LOCAL_WORLD_SIZE, else 8 when it
    divides the world, else the world), `device_type` to "cuda" when available, else "cpu". The result is the
    module's part of a ShardingPlan: `ShardingPlan({"": plan})`, or `{"sparse.ebc": plan}` for a child.

    >>> from rectoolkit import EmbeddingBagCollection, EmbeddingBagConfig
    >>> from rectoolkit.plan.constructors import column_wise, table_wise
    >>> ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=10,
    ...     feature_names=[n]) for n in ("a", "b")])
    >>> plan = construct_module_sharding_plan(ebc, {"a": table_wise(rank=1), "b": column_wise(ranks=[0, 1])},
    ...                                       world_size=2, device_type="cpu")
    >>> plan["a"].ranks, [s.shard_sizes for s in plan["b"].shards]
    ([1], [[10, 4], [10, 4]])
    """
    sharder = _sharder_for(module, sharder, "construct_module_sharding_plan")
    shardable = sharder.shardable_parameters(module)
    if set(shardable) != set(per_param_sharding):
        missing = [name for name in shardable if name not in per_param_sharding]
        unknown = [name for name in per_param_sharding if name not in shardable]
        raise ValueError(f"construct_module_sharding_plan: give a generator for each table of the "
                         f"{type(module).__name__} and no other; missing {missing}, not tables {unknown} "
                         f"(tables: {list(shardable)})")
    if world_size is None:
        if not dist.is_initialized():
            raise RuntimeError("construct_module_sharding_plan: torch.distributed is not initialized; pass "
                               "world_size= (and local_size=) or call dist.init_process_group first")
        world_size = dist.get_world_size()
    local_size = local_size or get_local_size(world_size)
    device_type = device_type or get_device_type()
    return EmbeddingModuleShardingPlan(
        (name, generate(shardable[name], local_size, world_size, device_type, sharder))
        for name, generate in per_param_sharding.items())
