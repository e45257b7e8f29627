"""DistributedModelParallel: shard the embedding collections of any model, replicate the rest with DDP.

    model = DistributedModelParallel(DLRM(...), plan=plan)        # every rank, after dist.init_process_group
    optimizer = CombinedOptimizer([model.fused_optimizer, ("dense", torch.optim.Adam(model.dense_parameters()))])
    loss = loss_fn(model(batch)); loss.backward(); optimizer.step()  # embedding updates happen in backward

What it does, in order (one plain function each, below):
1. find the EmbeddingBagCollection / EmbeddingCollection modules (`find_collections`);
2. plan them if no plan is given (`make_plan`: rectoolkit.planner when available, else table-wise by size),
   the same plan on every rank (rank 0's is broadcast); a given plan or a made one is validated
   (rectoolkit.plan.validation: every table, exact tiling, ranks) and its fingerprint compared across ranks (agree.py);
3. replace each collection by its sharded version (`shard_collections`); each rank keeps only its shards,
   taken from the collection's current weights (a meta-device collection gets freshly initialized shards);
4. wrap the model in DDP for the dense parameters (`data_parallel_wrapper`, rectoolkit.distributed.dense_wrapper),
   on a process group of its own so that DDP's asynchronous all-reduces never interleave with the embedding
   all-to-alls. Dense gradients are averaged
   (DDP), and so are the embedding gradients, as in TorchRec: each table gets the sum over ranks of their
   batches' gradients divided by the world size (TorchRec's comm_ops.GRADIENT_DIVISION;
   rectoolkit.distributed.comm_ops.set_gradient_division(False) sums them instead, except for DATA_PARALLEL
   replicas, always averaged like DDP's: TorchRec wraps their lookups in DDP). The replicas have the dense kernel:
   their gradients wait in .grad for your dense optimizer, as TorchRec's (rectoolkit.distributed.data_parallel).

`state_dict()` gives the unsharded model's names, as TorchRec's: each sharded table as a torch ShardedTensor (this
rank's shards as its `.local_shards()`, every rank's in its `.metadata()`; no communication, so one rank may call it
alone, and torch.distributed.checkpoint saves and reshards it), a DATA_PARALLEL table as its replica.
`rectoolkit.distributed.full_state_dict(model)` gives whole tables instead (a collective: every rank calls it; a
rank that calls it alone warns after 10 s and waits, one whose peer has left raises: rectoolkit.distributed.state).
`load_state_dict()` takes either: whole tensors, each rank copying its slices (so the state of a DMP of another plan
loads too), or ShardedTensors saved under the same plan.

`named_parameters()`, `bare_named_parameters()`, `named_buffers()` give TorchRec's names: the unsharded model's
("ebc.embedding_bags.t0.weight" for this rank's shard of t0), without the DDP wrapper's "module." prefix.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys

from rectoolkit.distributed.agree import check_same_plan
from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.dense_wrapper import (
    DataParallelWrapper, DefaultDataParallelWrapper, replicated_parameters, sharded_state_names)
from rectoolkit.distributed.fused_optimizer import model_fused_optimizer
from rectoolkit.distributed.meta_init import init_meta_parameters, move_dense_part
from rectoolkit.distributed.mc_embedding import ShardedManagedCollisionEmbeddingCollection
from rectoolkit.distributed.mc_embeddingbag import ShardedManagedCollisionEmbeddingBagCollection, sharded_mc_buffers
from rectoolkit.distributed.sharded_ebc import (
    ShardedCollection, ShardedEmbeddingBagCollection, shard_embedding_bag_collection)
from rectoolkit.distributed.sharded_ec import ShardedEmbeddingCollection, shard_embedding_collection
from rectoolkit.distributed.sharder_modules import shard_by_their_sharders, sharded_by_their_sharders
from rectoolkit.distributed.state import collection_state_prefix, load_table, table_state
from rectoolkit.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from rectoolkit.modules.table_sources import wrapped_collections
from rectoolkit.optim.fused import FusedOptimizerModule
from rectoolkit.optim.keyed import CombinedOptimizer
from rectoolkit.modules.mc_embedding_modules import (
    BaseManagedCollisionEmbeddingCollection, ManagedCollisionEmbeddingBagCollection)
from rectoolkit.plan.types import ShardingPlan, ShardingType
from rectoolkit.plan.validation import _shapes, validate_plan

Collection = Union[EmbeddingBagCollection, EmbeddingCollection]
Sharded = Union[ShardedEmbeddingBagCollection, ShardedEmbeddingCollection]


# ------------------------------------------------------------------------------------------------ steps
def find_collections(module: nn.Module) -> List[Tuple[str, Collection]]:
    """(path, module) of every embedding collection inside `module` ("" when `module` is one)."""
    return [(path, m) for path, m in module.named_modules() if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))]


def make_plan(module: nn.Module, env: ShardingEnv, sharders: Optional[List[Any]] = None) -> ShardingPlan:
    """A plan for every collection, by rectoolkit.planner. `sharders`, if given, limit the planner's sharding
    types (EmbeddingShardingPlanner.plan); the tables behind managed collisions are planned ROW_WISE.

    Computed on rank 0 and broadcast, so every rank shards alike.
    """
    plan = None
    if env.rank == 0:
        from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # imports us

        topology = Topology(world_size=env.world_size, compute_device=env.device.type,
                            local_world_size=env.local_world_size)
        row_wise_only = {config.name: ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value])
                         for _, m in module.named_modules() if isinstance(m, BaseManagedCollisionEmbeddingCollection)
                         for config in m._managed_collision_collection.embedding_configs()}
        plan = EmbeddingShardingPlanner(topology=topology, constraints=row_wise_only or None).plan(module, sharders)
    if env.world_size > 1 and (env.pg is not None or dist.is_initialized()):  # (ranks held in one process: one plan)
        box = [plan]
        dist.broadcast_object_list(box, group=env.pg, group_src=0)  # (rank 0 of env.pg)
        plan = box[0]
    return plan


def plan_at_collections(plan: ShardingPlan, module: nn.Module) -> ShardingPlan:
    """The plan keyed by the paths of the collections that get sharded: TorchRec keys the tables of a
    FeatureProcessedEmbeddingBagCollection by its own path ("fp"); here the collection inside it is sharded (its
    feature processors stay dense), so such an entry moves to the inner path ("fp._embedding_bag_collection").
    A managed-collision collection's entry moves to its "_embedding_module" likewise (wrapped_collections)."""
    moved = {wrapper_path: inner for inner, (wrapper_path, _) in wrapped_collections(module).items()}
    if not any(path in plan.plan for path in moved):
        return plan
    return ShardingPlan({moved.get(path, path): dict(tables) for path, tables in plan.plan.items()})


def collections_to_shard(module: nn.Module, plan: ShardingPlan, sharders: Optional[List[Any]]) -> List[str]:
    """The paths of the collections to shard, chosen as TorchRec chooses them: a collection is sharded when a sharder
    in `sharders` (any, when None) has its type (or its wrapper's) and the plan has an entry for it. The others stay
    as they are: a replica on every rank, its gradients all-reduced with the dense part. A collection that has a
    sharder but no plan entry, and a plan entry naming no collection, are warned about (a plan keyed by another
    path is the usual mistake; TorchRec says nothing)."""
    sharded_types = None if sharders is None else {_module_type_name(s) for s in sharders}
    wrappers = wrapped_collections(module)
    collections = find_collections(module)
    paths, unplanned = [], []
    for path, collection in collections:
        names = (wrappers.get(path, (None, None))[1], type(collection).__name__)
        if sharded_types is not None and not sharded_types.intersection(names):
            continue  # no sharder for it: TorchRec leaves it unsharded
        if plan.get_plan_for_module(path) is None:
            unplanned.append(path)
            continue
        paths.append(path)
    unknown = sorted(set(plan.plan) - {path for path, _ in collections})
    if unplanned:
        hint = (f"; a plan made from the bare tables is keyed by module path ''. Plan the whole model instead "
                f"(planner.plan(model) keys it by {unplanned[0]!r}) or pass {{{unplanned[0]!r}: plan.plan['']}}"
                if "" in unknown else "")
        warnings.warn(f"DistributedModelParallel: the plan has no entry for the collection(s) at {unplanned} (it has "
                      f"modules {sorted(plan.plan)}), so they stay unsharded: a whole replica on every rank, as "
                      f"TorchRec leaves them{hint}", stacklevel=3)
    if unknown:
        warnings.warn(f"DistributedModelParallel: the plan names module(s) {unknown} where the model has no embedding "
                      f"collection (collections at {[path for path, _ in collections]}); those entries "
                      "shard nothing", stacklevel=3)
    return paths


def _module_type_name(sharder: Any) -> Optional[str]:
    """The class name of what `sharder` shards (its module_type's), so that TorchRec's own sharders match too."""
    return getattr(getattr(sharder, "module_type", None), "__name__", None)


def _refuse_diverging_replicas(module: nn.Module, chosen: List[str], env: ShardingEnv) -> None:
    """An unsharded collection whose optimizer is fused into its backward (rectoolkit's optimizer=..., or
    _apply_optimizer_in_backward) would update each rank's replica with that rank's gradient alone."""
    if env.world_size == 1:
        return
    for path, collection in find_collections(module):
        recorded = any(hasattr(p, "_optimizer_classes") for p in collection.parameters())
        if path not in chosen and (collection.kernel.optimizer is not None or recorded):
            raise ValueError(f"DistributedModelParallel: the collection at {path!r} stays unsharded (no sharder or no "
                             "plan entry for it) but an optimizer is fused into its backward, so its replicas would "
                             f"diverge across the {env.world_size} ranks (each updated with its own gradient); shard "
                             "it, or build it without a fused optimizer (its gradient is then averaged by DDP)")


def shard_collections(module: nn.Module, plan: ShardingPlan, env: ShardingEnv, backend: str = "auto",
                      sharders: Optional[List[Any]] = None) -> Dict[str, Sharded]:
    """Replace every collection the plan names by its sharded version, in place; returns path -> sharded module.

    The shards' fused optimizer is TorchRec's: the sharder's `fused_params` (the sharder of the collection's type
    in `sharders`), what `_apply_optimizer_in_backward` recorded on the weights, or the collection's own; with none
    of them the "fused" kernels fuse SGD with lr 0.01, TorchRec's default (rectoolkit.distributed.fused_params).
    The output exchanges' wire precisions are that sharder's `qcomm_codecs_registry` (fbgemm_qcomm_codec).
    """
    # matched by the module type's name, as the planner matches sharders, so TorchRec's own sharders count too
    by_type = {_module_type_name(s): s for s in sharders or []}
    fused_params = {name: getattr(s, "fused_params", None) for name, s in by_type.items()}
    codecs = {name: getattr(s, "qcomm_codecs_registry", None) for name, s in by_type.items()}
    wrappers = wrapped_collections(module)  # a wrapper's sharder (feature-processed collection) before the inner's
    sharded: Dict[str, Sharded] = {}
    for path, collection in find_collections(module):
        module_plan = plan.get_plan_for_module(path) if isinstance(plan, ShardingPlan) else plan.get(path)
        if module_plan is None:
            continue  # left unsharded (collections_to_shard)
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if path else None
        if isinstance(parent, BaseManagedCollisionEmbeddingCollection):  # sharded with its managed collisions
            names = (type(parent).__name__, type(collection).__name__)
            sharded[path] = _shard_managed_collisions(module, parent_path, parent, module_plan, env,
                                                      _by_sharder(fused_params, *names), _by_sharder(codecs, *names))
            continue
        shard = shard_embedding_bag_collection if isinstance(collection, EmbeddingBagCollection) \
            else shard_embedding_collection
        wrapper = wrappers.get(path, (None, None))[1]
        names = (wrapper, type(collection).__name__)
        new = shard(collection, module_plan, env, backend, fused_params=_by_sharder(fused_params, *names),
                    torchrec_default_optimizer=True, qcomm_codecs_registry=_by_sharder(codecs, *names))
        sharded[path] = new
        if path == "":
            continue  # the caller holds the top-level collection itself
        setattr(parent, name, new)
    return sharded


def _by_sharder(options: Mapping[Optional[str], Any], *module_types: Optional[str]) -> Any:
    """The option (fused_params, qcomm_codecs_registry) of the first of `module_types` whose sharder sets it."""
    return next((options[name] for name in module_types if options.get(name) is not None), None)


def _shard_managed_collisions(module: nn.Module, path: str, collection: BaseManagedCollisionEmbeddingCollection,
                              module_plan: Any, env: ShardingEnv, fused_params: Optional[Mapping[str, Any]],
                              qcomm_codecs_registry: Optional[Dict[str, Any]]) -> Sharded:
    """Replace the managed-collision collection at `path` by its sharded version; returns its sharded lookup."""
    if not path:
        raise NotImplementedError("DistributedModelParallel: a ManagedCollisionEmbeddingBagCollection is sharded "
                                  "inside a model; wrap it in an nn.Module, or use its sharder's shard()")
    bags = isinstance(collection, ManagedCollisionEmbeddingBagCollection)
    new = (ShardedManagedCollisionEmbeddingBagCollection if bags else ShardedManagedCollisionEmbeddingCollection)(
        collection, module_plan, env, fused_params=fused_params, torchrec_default_optimizer=True,
        qcomm_codecs_registry=qcomm_codecs_registry)
    parent_path, _, name = path.rpartition(".")
    setattr(module.get_submodule(parent_path) if parent_path else module, name, new)
    return new._embedding_module


def dense_parameters(module: nn.Module, sharded: Mapping[str, Sharded]) -> List[nn.Parameter]:
    """What a dense optimizer must update: the replicated parameters, then the embedding shards without a fused
    optimizer (compute_kernel "dense", DATA_PARALLEL replicas, or a collection without one); TorchRec's
    in_backward_optimizer_filter."""
    plain_shards = [p for sub in sharded.values() for p in sub.parameters() if not hasattr(p, "_in_backward_optimizers")]
    return replicated_parameters(module, sharded) + plain_shards


def _unique(named: Iterator[Tuple[str, torch.Tensor]], remove_duplicate: bool) -> Iterator[Tuple[str, torch.Tensor]]:
    """Each tensor once (under its first name) when `remove_duplicate`, as nn.Module.named_parameters does."""
    seen = set()
    for name, tensor in named:
        if id(tensor) not in seen:
            if remove_duplicate:
                seen.add(id(tensor))
            yield name, tensor


# ------------------------------------------------------------------------------------------------ the module
class DistributedModelParallel(nn.Module):
    """TorchRec's DistributedModelParallel: shard the embedding collections, DDP for the dense rest.

    Args:
        module: any nn.Module holding EmbeddingBagCollection / EmbeddingCollection modules (or being one).
        env: a ShardingEnv, a process group, or None (the default group).
        device: where the shards live (default: cuda:<local rank> under NCCL, else cpu).
        plan: a ShardingPlan (module path -> table -> ParameterSharding); None: planned here.
        sharders: as in TorchRec, the collections whose type (or wrapper's) has a sharder here are sharded, the
            others stay unsharded (a replica on every rank, under DDP with the dense part); when the plan is made
            here they limit its sharding types; their `fused_params` set the shards' fused optimizer. None: every
            collection has one. A collection the plan has no entry for stays unsharded too (with a warning).
        init_data_parallel: wrap the dense part in DDP (default True; False: call `init_data_parallel()` later).
        data_parallel_wrapper: how `init_data_parallel()` wraps it (TorchRec's DataParallelWrapper interface);
            default DefaultDataParallelWrapper(), TorchRec's DDP options and defaults.
        model_tracker_configs: TorchRec's model delta tracking; only None (not implemented here).

    The shards' fused optimizer, as in TorchRec: the sharders' `fused_params`, or what torch's
    `_apply_optimizer_in_backward` recorded on the tables' weights, or the collection's own optimizer; with none of
    them, SGD with lr 0.01 is fused into the tables planned with a "fused" kernel. The "dense" ones and
    DATA_PARALLEL replicas keep plain gradients whatever the fused optimizer (TorchRec's DENSE kernel): give them
    to your dense optimizer (`dense_parameters()`, or in_backward_optimizer_filter(named_parameters())).
    `fused_optimizer` shows the fused ones.
        init_parameters: as TorchRec's, what happens to meta-device parameters and buffers outside the sharded
            collections (rectoolkit.distributed.meta_init): True (default) gives them memory on `device` (parameters
            reset by their module's `reset_parameters()`, buffers zeros), here and in `init_data_parallel()`; False
            leaves them on meta for you to materialize before `init_data_parallel()`. The shards are initialized
            either way (from the module's weights, or each table's init_fn on the meta device).
        local_world_size: ranks per host (TABLE_ROW_WISE / GRID_SHARD gateways); default LOCAL_WORLD_SIZE env
            variable, else all ranks on one host.
        backend: kernel backend of the shards ("auto" | "torch" | "fbgemm").
    """

    def __init__(self, module: nn.Module, env: Union[ShardingEnv, dist.ProcessGroup, None] = None,
                 device: Optional[torch.device] = None, plan: Optional[ShardingPlan] = None,
                 sharders: Optional[List[Any]] = None, init_data_parallel: bool = True,
                 init_parameters: bool = True, data_parallel_wrapper: Optional[DataParallelWrapper] = None,
                 model_tracker_configs: Any = None, local_world_size: Optional[int] = None,
                 backend: str = "auto") -> None:
        super().__init__()
        if model_tracker_configs is not None:
            raise NotImplementedError("DistributedModelParallel(model_tracker_configs=...): TorchRec's model delta "
                                      "tracking (the ids and rows each step touched) is not implemented in "
                                      "rectoolkit; leave it None")
        self.init_parameters = init_parameters
        if not isinstance(env, ShardingEnv):
            env = ShardingEnv.from_process_group(env, local_world_size=local_world_size,
                                                 device=torch.device(device) if device is not None else None)
        self.env = env
        if data_parallel_wrapper is not None and not callable(getattr(data_parallel_wrapper, "wrap", None)):
            raise TypeError(f"DistributedModelParallel: data_parallel_wrapper={data_parallel_wrapper!r} has no "
                            "wrap(dmp, env, device) method; subclass DataParallelWrapper (or pass None for DDP)")
        self._data_parallel_wrapper = data_parallel_wrapper or DefaultDataParallelWrapper()
        collections = find_collections(module)
        by_sharder = sharded_by_their_sharders(module, sharders)
        if not collections and not by_sharder:
            raise ValueError(f"DistributedModelParallel: {type(module).__name__} holds no EmbeddingBagCollection or "
                             "EmbeddingCollection (nor a module of a type one of `sharders` shards, such as a "
                             "quantized collection with its Quant...Sharder); use torch's DistributedDataParallel for "
                             "a dense-only model")
        self.plan: ShardingPlan = plan if plan is not None else make_plan(module, env, sharders)
        if not isinstance(self.plan, ShardingPlan):
            self.plan = ShardingPlan(dict(self.plan))
        module = shard_by_their_sharders(module, by_sharder, self.plan, env)  # quantized collections (inference)
        float_plan = ShardingPlan({path: tables for path, tables in self.plan.plan.items()
                                   if path not in {p for p, _, _ in by_sharder}})
        sharded: Dict[str, Sharded] = {}
        if collections:
            # self.plan keeps TorchRec's keys (a feature-processed collection's own path); the collections are
            # sharded at theirs
            at_collections = plan_at_collections(float_plan, module)
            chosen = collections_to_shard(module, at_collections, sharders)
            _refuse_diverging_replicas(module, chosen, env)
            at_collections = ShardingPlan({path: at_collections.plan[path] for path in chosen})
            shapes = {key: shape for key, shape in _shapes(module).items() if key[0] in chosen}
            validate_plan(at_collections, shapes, env.world_size, source="the plan of DistributedModelParallel")
            check_same_plan(at_collections, env)  # a stale plan file on one host would compute wrong results silently
            sharded = shard_collections(module, at_collections, env, backend, sharders)
        if "" in sharded:  # the model IS a collection
            module = sharded[""]
        if init_parameters:
            init_meta_parameters(module, env.device)
        if env.device.type != "cpu":
            move_dense_part(module, env.device)  # shards are already there; meta tensors stay (init_parameters=False)
        self._sharded = sharded
        self._plain_module = module
        self._dmp_wrapped_module = module
        self._data_parallel = False
        self._optim = model_fused_optimizer(sharded)
        if init_data_parallel:
            self.init_data_parallel()

    def init_data_parallel(self) -> None:
        """Wrap the dense part in DDP (world size > 1 and dense parameters); for a DMP built with
        init_data_parallel=False (e.g. to move the dense part first). Calling it again does nothing."""
        if not self._data_parallel:
            if self.init_parameters:  # what became meta since (TorchRec does it here too)
                init_meta_parameters(self._plain_module, self.env.device)
            self._data_parallel_wrapper.wrap(self, self.env, self.env.device)
            self._data_parallel = True

    @property
    def fused_optimizer(self) -> CombinedOptimizer:
        """TorchRec's: a CombinedOptimizer of each sharded collection's fused optimizer, keyed by its path
        (rectoolkit.distributed.fused_optimizer); `.params` "ebc.embedding_bags.t0.weight", one param group per
        sharding group. Its step() and zero_grad() only push a changed lr (the updates happen in backward)."""
        return self._optim

    @property
    def device(self) -> torch.device:
        """Where this rank's shards live."""
        return self.env.device

    @staticmethod
    def _sharded_parameter_names(module: nn.Module, prefix: str = "") -> List[str]:
        """The names, inside `module`, of every rank's own state: the sharded collections' parameters and buffers
        and the managed-collision slots. DDP must ignore them (TorchRec's DataParallelWrapper reads this)."""
        sharded = [sub for sub in module.modules() if isinstance(sub, ShardedCollection)]
        return [prefix + name for name in sharded_state_names(module, sharded, sharded_mc_buffers(module))]

    def copy(self, device: torch.device) -> "DistributedModelParallel":
        """A copy of this DMP, shards, optimizer state and all, sharing the process group (TorchRec's
        `dmp.copy(device)`). The shards live on this rank's device, so `device` must be that device."""
        if torch.device(device) != self.env.device:
            raise NotImplementedError(f"DistributedModelParallel.copy({device}): the shards live on {self.env.device} "
                                      "and rectoolkit does not move shards between devices; build the DMP with "
                                      f"device={device} instead")
        if self._dmp_wrapped_module is not self._plain_module:
            raise NotImplementedError("DistributedModelParallel.copy: the dense part is wrapped in DDP, which cannot be "
                                      "copied; build the DMP with init_data_parallel=False, copy it, then call "
                                      "init_data_parallel() on each")
        from torch.distributed.device_mesh import DeviceMesh

        shared = (*vars(self.env).values(), dist.GroupMember.WORLD)  # (a 2D env's groups and mesh too)
        groups = {id(g): g for g in shared if isinstance(g, (dist.ProcessGroup, DeviceMesh))}
        return copy.deepcopy(self, memo=groups)

    # ------------------------------------------------------------------ running
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The model's output, as TorchRec's DMP gives it: a model's tensors (its code uses the sharded
        collections' awaitables as their results), or the awaitable itself when the model is one collection
        (`.wait()` gives the KeyedTensor / dict; `.values()`, `[key]` work on it directly)."""
        return self._dmp_wrapped_module(*args, **kwargs)

    @property
    def module(self) -> nn.Module:
        """The model with its collections sharded (without the DDP wrapper)."""
        return self._plain_module

    @module.setter
    def module(self, value: nn.Module) -> None:
        if self._dmp_wrapped_module is not self._plain_module:
            raise RuntimeError("DistributedModelParallel.module can't be set after init_data_parallel(); build the "
                               "DMP with init_data_parallel=False, set module, then call init_data_parallel()")
        self._plain_module = self._dmp_wrapped_module = value

    # ------------------------------------------------------------------ TorchRec's names
    def _named_members(self, members: str, module: nn.Module, prefix: str,
                       recurse: bool) -> Iterator[Tuple[str, torch.Tensor]]:
        """TorchRec's walk: a sharded collection names its shards by its tables (parameters) and holds no buffers
        of the model's; `recurse` only reaches the sharded collections, as in TorchRec."""
        if isinstance(module, ShardedCollection):
            if members == "parameters":
                yield from module.torchrec_named_parameters(prefix + "." if prefix else "")
            return
        yield from getattr(module, "named_" + members)(prefix, recurse=False)
        for name, child in module.named_children():
            yield from self._named_members(members, child, f"{prefix}.{name}" if prefix else name, recurse)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[Tuple[str, nn.Parameter]]:
        """The model's parameters under the unsharded model's names: this rank's shard of table t0 of the
        collection at "ebc" is "ebc.embedding_bags.t0.weight" (a table without a shard here: TorchRec's empty
        placeholder of shape (0,), see table_view.py)."""
        return _unique(self._named_members("parameters", self._plain_module, prefix, recurse), remove_duplicate)

    def bare_named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[Tuple[str, nn.Parameter]]:
        """named_parameters() without duplicates (TorchRec's name for it)."""
        return self.named_parameters(prefix, recurse, remove_duplicate=True)

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
        """The model's buffers under its own names; the sharded collections' bookkeeping is not listed."""
        return _unique(self._named_members("buffers", self._plain_module, prefix, recurse), remove_duplicate)

    def sparse_grad_parameter_names(self, destination: Optional[List[str]] = None, prefix: str = "") -> List[str]:
        """Names of the parameters with sparse gradients: the weights of nn.Embedding / nn.EmbeddingBag modules
        built with sparse=True outside the sharded collections (appended to `destination` when given)."""
        destination = [] if destination is None else destination

        def visit(module: nn.Module, path: str) -> None:
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
                destination.append(f"{path}.weight" if path else "weight")
            elif not isinstance(module, ShardedCollection):
                for name, child in module.named_children():
                    visit(child, f"{path}.{name}" if path else name)

        visit(self._plain_module, prefix)
        return destination

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients without all-reduces (rectoolkit's; TorchRec 1.8's DMP has none, its
        GradientAccumulationWrapper enters no_sync() on every DDP in the model, rectoolkit's on the same modules):
        the dense part's DDP no_sync (once wrapped) and every sharded collection's (its DATA_PARALLEL replicas',
        ShardedCollection.no_sync). Run the forward and backward inside; the first backward outside all-reduces
        what accumulated, averaged like DDP's.

            with model.no_sync():
                loss_fn(model(batch)).backward()   # local gradients only
            loss_fn(model(next_batch)).backward()  # all-reduced, the accumulated ones with it
        """
        with contextlib.ExitStack() as stack:
            wrapped = self._dmp_wrapped_module
            if wrapped is not self._plain_module and hasattr(wrapped, "no_sync"):
                stack.enter_context(wrapped.no_sync())
            for module in self._plain_module.modules():
                if isinstance(module, ShardedCollection):
                    stack.enter_context(module.no_sync())
            yield

    @property
    def sharded_modules(self) -> Dict[str, Sharded]:
        return dict(self._sharded)

    def dense_parameters(self) -> List[nn.Parameter]:
        """Give these to the dense optimizer: the replicated parameters (DDP), then the embedding shards whose
        optimizer is not fused (compute_kernel "dense"; their gradients are local to their rank; DATA_PARALLEL
        replicas: averaged over the ranks, as DDP averages them)."""
        return dense_parameters(self._plain_module, self._sharded)

    def named_dense_parameters(self) -> Iterator[Tuple[str, nn.Parameter]]:
        ids = {id(p) for p in self.dense_parameters()}
        return ((n, p) for n, p in self.named_parameters() if id(p) in ids)

    # ------------------------------------------------------------------ measurements
    def bytes_sent(self) -> Dict[str, Any]:
        """collective -> [W, W] bytes matrix since the last reset_bytes_sent() (collective call)."""
        return self.env.gathered_bytes()

    def reset_bytes_sent(self) -> None:
        self.env.stats.reset()

    def memory_usage(self) -> Dict[str, int]:
        """This rank's bytes: embedding shard weights, their fused optimizer state, how much of that is in host
        and in GPU memory, the replicated (dense) parameters, and on GPU the CUDA allocator's peak."""
        usage = {"embedding_weights": 0, "embedding_optimizer": 0, "embedding_host": 0, "embedding_device": 0}
        for collection in self._sharded.values():
            held = collection.memory_bytes()
            for kind in ("weights", "optimizer", "host", "device"):
                usage["embedding_" + kind] += held[kind]
        usage["dense_parameters"] = sum(p.numel() * p.element_size()
                                        for p in replicated_parameters(self._plain_module, self._sharded))
        if self.env.device.type == "cuda":
            usage["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(self.env.device))
        return usage

    # ------------------------------------------------------------------ state
    def _sharded_keys(self) -> Dict[str, Tuple[Sharded, str]]:
        """Global state_dict key -> (sharded collection, table)."""
        keys = {}
        for path, collection in self._sharded.items():
            prefix = (path + "." if path else "") + collection_state_prefix(collection)
            for config in collection.embedding_configs():
                keys[f"{prefix}{config.name}.weight"] = (collection, config.name)
        return keys

    def state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Dict[str, torch.Tensor]:
        """The unsharded model's names; each sharded table as a ShardedTensor (state.table_state; module docstring).
        Keys in sorted order, as TorchRec's DMP gives them (its add_prefix_to_state_dict sorts; `destination`'s own
        keys too)."""
        # the sharded collections' own state_dict holds their tables (table_view.py); anything else under their paths
        # is their own bookkeeping
        plain = self._plain_module.state_dict(keep_vars=keep_vars)
        sharded_keys = self._sharded_keys()
        shard_prefixes = tuple(path + "." for path in self._sharded if path)
        out: Dict[str, torch.Tensor] = OrderedDict(
            (prefix + key, value) for key, value in plain.items()
            if key in sharded_keys or ("" not in self._sharded and not key.startswith(shard_prefixes)))
        for key, (collection, table) in sharded_keys.items():  # the same order on every rank
            if prefix + key not in out:
                out[prefix + key] = table_state(collection, table, keep_vars)
        result = destination if destination is not None else out
        if destination is not None:
            destination.update(out)
        for key in sorted(result):
            result[key] = result.pop(key)
        return result

    def load_state_dict(self, state_dict: Mapping[str, torch.Tensor], prefix: str = "",
                        strict: bool = True) -> _IncompatibleKeys:
        """Load the unsharded model's names (each key after `prefix`, as TorchRec's signature has it): whole tables,
        each rank copying its own slices (so the state of a DMP with another plan loads too), or ShardedTensors saved
        under the same plan."""
        if prefix:
            state_dict = {key[len(prefix):]: value for key, value in state_dict.items() if key.startswith(prefix)}
        sharded_keys = self._sharded_keys()
        missing = [k for k in sharded_keys if k not in state_dict]
        dense_state = {k: v for k, v in state_dict.items() if k not in sharded_keys}
        for key, (collection, table) in sharded_keys.items():
            if key in state_dict:
                load_table(collection, table, state_dict[key])
        result = None
        if "" not in self._sharded:
            shard_prefixes = [p + "." for p in self._sharded]
            result = self._plain_module.load_state_dict(dense_state, strict=False)
            missing += [k for k in result.missing_keys if not any(k.startswith(sp) for sp in shard_prefixes)]
            unexpected = list(result.unexpected_keys)
        else:
            unexpected = list(dense_state)
        if strict and (missing or unexpected):
            raise RuntimeError(f"DistributedModelParallel.load_state_dict: missing keys {missing}, "
                               f"unexpected keys {unexpected}")
        return _IncompatibleKeys(missing, unexpected)

    def extra_repr(self) -> str:
        return f"rank={self.env.rank}, world_size={self.env.world_size}, local_world_size={self.env.local_world_size}"


FusedOptimizerModule.register(DistributedModelParallel)  # as TorchRec's DMP (a FusedOptimizerModule subclass)


# ------------------------------------------------------------------------------------------------ TorchRec's helpers
def get_unwrapped_module(module: nn.Module) -> nn.Module:
    """TorchRec's: the module inside every DMP / DDP / FSDP wrapper (a DMP's dense DDP wrapper included), e.g. the
    model with its collections sharded for a DMP; any other module is returned as is."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    while isinstance(module, (DistributedModelParallel, DistributedDataParallel, FullyShardedDataParallel)):
        if isinstance(module, DistributedModelParallel):
            module = module._dmp_wrapped_module
        elif isinstance(module, FullyShardedDataParallel):
            module = module._fsdp_wrapped_module
        else:
            module = module.module
    return module


def get_module(module: nn.Module) -> nn.Module:
    """TorchRec's: the module inside DMP wrappers only; a data-parallel wrapper (DDP / FSDP, e.g. the DDP around a
    DMP's dense part after init_data_parallel()) is kept, so that its overrides apply."""
    while isinstance(module, DistributedModelParallel):
        module = module._dmp_wrapped_module
    return module


def __getattr__(name: str) -> Any:
    """TorchRec's DMPCollection, at its path (defined in rectoolkit.distributed.two_dimensional, which builds on this
    module)."""
    if name == "DMPCollection":
        from rectoolkit.distributed.two_dimensional import DMPCollection

        return DMPCollection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
