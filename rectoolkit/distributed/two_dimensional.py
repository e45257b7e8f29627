"""2D parallelism (TorchRec's DMPCollection): the model sharded over each group of ranks, the groups replicas.

With W ranks and a sharding group size G, the world is G-rank sharding groups, W / G of them, each holding the whole
model sharded by the same plan (a plan for G ranks), and W / G-rank replica groups, one per position in a sharding
group. Each sharding group trains on its own ranks' batches as a DistributedModelParallel of G ranks would (its
all-to-alls stay within the group, so they shrink as W grows); the dense part is data-parallel over all W ranks;
and `sync()` averages each shard's weights (and, by default, its fused optimizer state) over its replica group, so
the groups hold the same model again. TorchRec calls it every few steps. The layout of the ranks is TorchRec's:

    the default                       sharding group k: ranks k, k + W/G, k + 2W/G, ... (strided: a shard's replicas
                                      are neighbouring ranks, on one host where hosts hold W/G ranks or more)
    use_inter_host_allreduce=True     sharding group k: ranks kG .. kG + G - 1 (contiguous: the sharding all-to-alls
                                      stay on a host, the replica all-reduce crosses hosts)

    >>> peer_matrix(world_size=8, sharding_group_size=4)  # rows: sharding groups; columns: replica groups
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    >>> peer_matrix(8, 4, use_inter_host_allreduce=True)
    [[0, 1, 2, 3], [4, 5, 6, 7]]

The plan passed in names the sharding group's ranks 0..G-1; `dmp.plan` shows it on the global ranks of this rank's
group (TorchRec remaps it so, in place), `dmp.group_plan` as given. `state_dict()` holds each sharded table as a
ShardedTensor on the sharding group, its shards placed by global rank (TorchRec 1.8 gives DTensors here); every
sharding group's shards are the same after sync(), so torch.distributed.checkpoint saves one copy of each and loads
it into every group. Unlike TorchRec's, it runs on CPU with gloo too, and sync() also averages DATA_PARALLEL
replicas (TorchRec leaves them to diverge between sharding groups).
"""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Type

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from rectoolkit.distributed.comm import ShardingEnv
from rectoolkit.distributed.dense_wrapper import DataParallelWrapper
from rectoolkit.distributed.interfaces import ShardingStrategy
from rectoolkit.distributed.mc_embedding import ShardedManagedCollisionEmbeddingCollection
from rectoolkit.distributed.mc_embeddingbag import ShardedManagedCollisionEmbeddingBagCollection
from rectoolkit.distributed.model_parallel import DistributedModelParallel
from rectoolkit.distributed.replicas import all_reduce_gradients
from rectoolkit.plan.traffic import peer_matrix
from rectoolkit.plan.types import ShardingPlan, ShardMetadata

__all__ = ["DMPCollection", "DMPCollectionConfig", "ShardingEnv2D", "ShardingStrategy", "peer_matrix"]


class DMPCollectionConfig:
    """TorchRec's per-submodule settings of a DMPCollection (its own plan and group size for one module type).
    DMPCollection refuses them here: every sharded module shares the one sharding group size."""

    def __init__(self, module: Type[nn.Module], plan: ShardingPlan, sharding_group_size: int,
                 node_group_size: Optional[int] = None, use_inter_host_allreduce: bool = False,
                 sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT) -> None:
        self.module, self.plan, self.sharding_group_size = module, plan, sharding_group_size
        self.node_group_size, self.use_inter_host_allreduce = node_group_size, use_inter_host_allreduce
        self.sharding_strategy = sharding_strategy


class ShardingEnv2D(ShardingEnv):
    """TorchRec's ShardingEnv2D: `world_size`, `rank` and the collectives' group are the sharding group's;
    `process_group` is the global group, as TorchRec's (the dense part's DDP runs on it); `replica_pg` the group of
    this rank's replicas. `device_mesh` is TorchRec's 2D mesh ("replicate", "shard")."""

    def __init__(self, sharding_pg: dist.ProcessGroup, replica_pg: dist.ProcessGroup, global_pg: dist.ProcessGroup,
                 device_mesh: Any = None, node_group_size: Optional[int] = None,
                 use_inter_host_allreduce: bool = False,
                 sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT,
                 device: Optional[torch.device] = None) -> None:
        size = dist.get_world_size(sharding_pg)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(sharding_pg) == "nccl" \
                else torch.device("cpu")
        super().__init__(size, dist.get_rank(sharding_pg), sharding_pg,
                         local_world_size=node_group_size if node_group_size is not None else size, device=device)
        self.sharding_pg, self.replica_pg, self.global_pg = sharding_pg, replica_pg, global_pg
        self.global_world_size = dist.get_world_size(global_pg)
        self.global_rank = dist.get_rank(global_pg)
        self.device_mesh = device_mesh
        self.node_group_size = node_group_size
        self.use_inter_host_allreduce = use_inter_host_allreduce
        self.sharding_strategy = sharding_strategy

    @property
    def process_group(self) -> dist.ProcessGroup:
        """The global group (TorchRec's ShardingEnv2D.process_group); the sharding group is `sharding_pg`."""
        return self.global_pg

    def num_sharding_groups(self) -> int:
        """How many times the sharded model is replicated (TorchRec's)."""
        return self.global_world_size // self.world_size

    def remap_rank(self, rank: int, sharding_type: Any = None) -> int:
        """TorchRec's: global `rank`'s position in its sharding group (its rank in the group's plan), for any
        sharding type (TorchRec's answers table-, column-wise and grid only and raises for the others)."""
        if not 0 <= rank < self.global_world_size:
            raise ValueError(f"ShardingEnv2D.remap_rank: rank {rank} is not in 0..{self.global_world_size - 1}")
        return rank % self.world_size if self.use_inter_host_allreduce else rank // self.num_sharding_groups()


def _node_group_size(node_group_size: Optional[int], world_size: int, sharding_group_size: int,
                     use_inter_host_allreduce: bool) -> int:
    """Ranks of one sharding group per host, for TABLE_ROW_WISE and GRID_SHARD's two-level collectives: as given,
    else from LOCAL_WORLD_SIZE (ranks per host): the group's ranks on one host (strided: W/G apart)."""
    if node_group_size is not None:
        if node_group_size <= 0 or sharding_group_size % node_group_size:
            raise ValueError(f"DMPCollection: node_group_size={node_group_size} does not divide sharding_group_size="
                             f"{sharding_group_size}")
        return node_group_size
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    here = per_host if use_inter_host_allreduce else per_host // (world_size // sharding_group_size)
    here = min(max(here, 1), sharding_group_size)
    return here if sharding_group_size % here == 0 else sharding_group_size


def _on_global_ranks(plan: ShardingPlan, ranks: Sequence[int]) -> ShardingPlan:
    """`plan` (a copy) with each shard's rank the global rank `ranks[rank]` (TorchRec's remapped plan)."""
    remapped = copy.deepcopy(plan)
    for tables in remapped.plan.values():
        for ps in tables.values():
            if ps.ranks is not None:
                ps.ranks = [ranks[r] for r in ps.ranks]
            ps.shards = [ShardMetadata(list(s.shard_offsets), list(s.shard_sizes),
                                       f"rank:{ranks[s.rank]}/{_device_of(s.device, ranks[s.rank])}")
                         for s in ps.shards] if ps.shards is not None else ps.shards
    return remapped


def _device_of(device: str, global_rank: int) -> str:
    """A shard's device on its global rank: a GPU is that rank's local one (TorchRec's "cuda:<rank % local size>")."""
    if not device.startswith("cuda"):
        return device
    return f"cuda:{global_rank % int(os.environ.get('LOCAL_WORLD_SIZE', max(torch.cuda.device_count(), 1)))}"


class DMPCollection(DistributedModelParallel):
    """TorchRec's DMPCollection (module docstring): a DistributedModelParallel on this rank's sharding group, its
    dense part data-parallel over the world, `sync()` averaging the shards over the replica groups.

        dmp = DMPCollection(model, device, plan, world_size=4, sharding_group_size=2, global_pg=dist.group.WORLD)
        for step, batch in enumerate(batches):
            dmp(batch).sum().backward(); dense_optimizer.step()
            if step % 10 == 9:
                dmp.sync()

    `plan`: a plan for `sharding_group_size` ranks (e.g. EmbeddingShardingPlanner(Topology(world_size=
    sharding_group_size, ...))), the same on every rank; None plans as DistributedModelParallel does, within each
    group. `custom_all_reduce(tensors)` replaces sync()'s averaging (it must average `tensors` in place over the
    replica group, `dmp.env.replica_pg`). Refused by name: FULLY_SHARDED, submodule_configs, rs_awaitable_hook_module,
    use_sharded_relay, and managed-collision collections (each group's remapping of ids diverges: averaging their rows
    would mix different ids)."""

    def __init__(self, module: nn.Module, device: Optional[torch.device], plan: Optional[ShardingPlan], world_size: int,
                 sharding_group_size: int, global_pg: Optional[dist.ProcessGroup] = None,
                 sharding_strategy: ShardingStrategy = ShardingStrategy.DEFAULT,
                 node_group_size: Optional[int] = None, sharders: Optional[List[Any]] = None,
                 init_data_parallel: bool = True, init_parameters: bool = True,
                 data_parallel_wrapper: Optional[DataParallelWrapper] = None, use_inter_host_allreduce: bool = False,
                 custom_all_reduce: Optional[Callable[[List[torch.Tensor]], None]] = None,
                 submodule_configs: Optional[List[DMPCollectionConfig]] = None,
                 rs_awaitable_hook_module: Optional[str] = None, use_sharded_relay: bool = False) -> None:
        _refuse_unimplemented(sharding_strategy, submodule_configs, rs_awaitable_hook_module, use_sharded_relay)
        if not dist.is_initialized():
            raise RuntimeError("DMPCollection: torch.distributed is not initialized; start the ranks (rtk.launch or "
                               "torchrun) and call dist.init_process_group first")
        global_pg = global_pg if global_pg is not None else dist.group.WORLD
        if dist.get_world_size(global_pg) != world_size or world_size != dist.get_world_size():
            raise ValueError(f"DMPCollection: world_size={world_size}, but the global group has "
                             f"{dist.get_world_size(global_pg)} ranks and the world {dist.get_world_size()}; pass "
                             "the whole world's group and its size")
        matrix = peer_matrix(world_size, sharding_group_size, use_inter_host_allreduce)
        if plan is not None and not isinstance(plan, ShardingPlan):  # ({module path: {table: ParameterSharding}})
            plan = ShardingPlan(dict(plan))
        if plan is not None:
            _check_group_plan(plan, sharding_group_size)
        mesh, sharding_pg, replica_pg = _process_groups(matrix, device)
        env = ShardingEnv2D(sharding_pg, replica_pg, global_pg, mesh,
                            _node_group_size(node_group_size, world_size, sharding_group_size,
                                             use_inter_host_allreduce),
                            use_inter_host_allreduce, sharding_strategy,
                            torch.device(device) if device is not None else None)
        group_plan = copy.deepcopy(plan) if plan is not None else None
        self._custom_all_reduce = custom_all_reduce
        super().__init__(module, env, device, group_plan, sharders, init_data_parallel, init_parameters,
                         data_parallel_wrapper)
        mc = [path for path, sub in self._sharded.items()
              if isinstance(sub, (ShardedManagedCollisionEmbeddingBagCollection,
                                  ShardedManagedCollisionEmbeddingCollection))]
        if mc:
            raise NotImplementedError(
                f"DMPCollection: {mc} hold managed collisions; each sharding group remaps raw ids to rows on its own, "
                "so averaging their rows over the replica groups would mix different ids. Shard them with "
                "DistributedModelParallel over the whole world")
        replica_pg = self.env.replica_pg
        # sync()'s collectives, counted as the engine counts its own (rectoolkit.distributed.replicas)
        self.sync_env = ShardingEnv(dist.get_world_size(replica_pg), dist.get_rank(replica_pg), replica_pg,
                                    device=self.env.device)
        self.group_plan: ShardingPlan = self.plan
        mine = next(row for row in matrix if dist.get_rank() in row)
        self.plan = _on_global_ranks(self.plan, mine)
        if plan is not None:  # TorchRec remaps the caller's plan in place
            plan.plan.clear()
            plan.plan.update(self.plan.plan)

    @property
    def device_mesh(self) -> Any:
        """TorchRec's 2D DeviceMesh: dimension "replicate" (rows: sharding groups) and "shard"."""
        return self.env.device_mesh

    def _sync_tensors(self, include_optimizer_state: bool) -> Dict[torch.dtype, List[torch.Tensor]]:
        """This rank's tensors that sync() averages, by dtype: every shard's weight (DATA_PARALLEL replicas too),
        then, with include_optimizer_state, every fused optimizer state (the shard's momentum1, momentum2)."""
        weights: Dict[torch.dtype, List[torch.Tensor]] = {}
        states: Dict[torch.dtype, List[torch.Tensor]] = {}
        for path in sorted(self._sharded):
            for _, _, weight, state in self._sharded[path].local_shards():
                weights.setdefault(weight.dtype, []).append(weight)
                for name in sorted(state) if include_optimizer_state else ():
                    states.setdefault(state[name].dtype, []).append(state[name])
        for dtype, tensors in states.items():
            weights.setdefault(dtype, []).extend(tensors)
        return weights

    @torch.no_grad()
    def sync(self, include_optimizer_state: bool = True) -> None:
        """Average every shard's weight (and with include_optimizer_state its fused optimizer state) over this rank's
        replica group, one all-reduce per dtype (or `custom_all_reduce` per dtype). A collective of every rank. The
        bytes it sends to each replica are counted in `sync_env.stats.bytes_sent["sync_allreduce"]` (indexed by
        rank in the replica group), as the engine counts its data-parallel all-reduce."""
        replicas = self.sync_env.world_size
        for dtype, tensors in sorted(self._sync_tensors(include_optimizer_state).items(), key=lambda kv: str(kv[0])):
            if self._custom_all_reduce is not None:
                self._custom_all_reduce(tensors)
                continue
            if replicas == 1:
                continue
            flat = _flatten_dense_tensors([t.detach() for t in tensors])
            # a sum (gloo has no AVG), then divided; its bytes counted in sync_env.stats as "sync_allreduce"
            all_reduce_gradients(self.sync_env, flat, [t.numel() for t in tensors], "sync_allreduce")
            flat /= replicas
            for tensor, averaged in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                tensor.detach().copy_(averaged)

    def set_all_reduce_hook(self, reduce_hook: Callable[[List[torch.Tensor]], None]) -> None:
        """TorchRec's: replace sync()'s averaging by `reduce_hook(tensors)` (per dtype; it must average them in place
        over the replica group, `dmp.env.replica_pg`), as `custom_all_reduce` does; a hook set before is replaced
        (with a warning, as TorchRec's)."""
        if self._custom_all_reduce is not None:
            warnings.warn("DMPCollection.set_all_reduce_hook: replacing the custom all-reduce set before",
                          RuntimeWarning, stacklevel=2)
        self._custom_all_reduce = reduce_hook

    def ensure_reduce_scatter_complete(self) -> None:
        """TorchRec's FULLY_SHARDED wait; nothing to wait for here (FULLY_SHARDED is refused)."""

    def extra_repr(self) -> str:
        env = self.env
        return (f"global_rank={env.global_rank}, world_size={env.global_world_size}, sharding_group_size="
                f"{env.world_size}, rank_in_group={env.rank}")


def _refuse_unimplemented(strategy: ShardingStrategy, submodule_configs: Any, hook_module: Any,
                          sharded_relay: bool) -> None:
    if ShardingStrategy(strategy) == ShardingStrategy.FULLY_SHARDED:
        raise NotImplementedError("DMPCollection(sharding_strategy=FULLY_SHARDED): reduce-scattering the weights "
                                  "over the replica group each step is not implemented in rectoolkit; use "
                                  "ShardingStrategy.DEFAULT and call sync()")
    if submodule_configs:
        raise NotImplementedError("DMPCollection(submodule_configs=...): per-module plans and group sizes are not "
                                  "implemented in rectoolkit; one plan and sharding_group_size for the whole model")
    if hook_module is not None:
        raise NotImplementedError("DMPCollection(rs_awaitable_hook_module=...): a FULLY_SHARDED setting; leave it None")
    if sharded_relay:
        raise NotImplementedError("DMPCollection(use_sharded_relay=True): NCCL's sharded relay all-reduce is not "
                                  "available in rectoolkit; leave it False")


def _process_groups(matrix: List[List[int]], device: Optional[torch.device]):
    """(2D DeviceMesh, this rank's sharding group, its replica group), made by every rank (each group of the mesh)."""
    from torch.distributed.device_mesh import DeviceMesh

    kind = torch.device(device).type if device is not None else \
        ("cuda" if dist.get_backend() == "nccl" else "cpu")
    mesh = DeviceMesh(kind, torch.tensor(matrix), mesh_dim_names=("replicate", "shard"))
    return mesh, mesh.get_group("shard"), mesh.get_group("replicate")


def _check_group_plan(plan: ShardingPlan, sharding_group_size: int) -> None:
    """Every shard of `plan` on a rank of the sharding group (0..G-1): the plan is the group's, not the world's."""
    for path, tables in plan.plan.items():
        for table, ps in tables.items():
            ranks = [s.rank for s in ps.shards or []] + list(ps.ranks or [])
            beyond = sorted({r for r in ranks if r is not None and not 0 <= r < sharding_group_size})
            if beyond:
                raise ValueError(
                    f"DMPCollection: the plan places table {table!r} (module {path!r}) on rank(s) {beyond}, but each "
                    f"sharding group has {sharding_group_size} ranks (0..{sharding_group_size - 1}): plan for the "
                    f"group, e.g. EmbeddingShardingPlanner(topology=Topology(world_size={sharding_group_size}, ...))")
