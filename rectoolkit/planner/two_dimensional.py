"""2D parallelism priced: a step of one sharding group plus its share of the replicas' sync (docs/two_dimensional.md).

TorchRec's DMPCollection (rectoolkit.distributed.two_dimensional) shards the tables over groups of G ranks and
keeps the W / G groups as replicas, averaged by `sync()` every few steps. Choosing G trades three things, and this
module prices each from the plan:

- a group's step: the group plan on G ranks (CostModel.evaluate on `group_topology`: its all-to-alls span G ranks,
  not W), with the other groups' ranks working at the same time on the same hosts (CostModel's `host_copies`);
- the sync: every shard's weight and fused optimizer state summed over its W / G replicas
  (rectoolkit.plan.traffic.sync_traffic's bytes at the profile's all-reduce speed, one all-reduce per dtype as
  rectoolkit.distributed.replicas sends them, each with its latency; the copies into and out of the flat buffer),
  paid once every `sync_interval` steps;
- memory: each rank holds 1 / G of the tables instead of 1 / W.

    >>> from rectoolkit.modules.configs import EmbeddingBagConfig
    >>> from rectoolkit.planner.planner import EmbeddingShardingPlanner
    >>> tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=16, feature_names=[f"f{i}"])
    ...           for i in range(4)]
    >>> world = Topology(world_size=4, compute_device="cpu")
    >>> group = group_topology(world, sharding_group_size=2)
    >>> plan = EmbeddingShardingPlanner(group, batch_size=64).plan(tables)
    >>> cost = price_two_dimensional(plan, tables, world, sharding_group_size=2, batch_size=64)
    >>> cost.replicas, [int(b) for b in cost.sync_bytes]  # a rank holds 128,000 bytes: half out in each phase
    (2, [128000, 128000, 128000, 128000])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from rectoolkit.kernels.optimizer_state import EmbOptimType
from rectoolkit.plan.traffic import peer_matrix, sync_traffic, synced_tensors
from rectoolkit.plan.types import ShardingPlan
from rectoolkit.planner.constraints import ParameterConstraints
from rectoolkit.planner.cost import CostModel, PlanCost
from rectoolkit.planner.stats import WorkloadStats
from rectoolkit.planner.tables import PlannerTable, collect_tables, tables_by_module
from rectoolkit.planner.topology import Topology

if TYPE_CHECKING:
    import pandas as pd


def group_topology(topology: Topology, sharding_group_size: int, use_inter_host_allreduce: bool = False) -> Topology:
    """The topology one sharding group plans on (`Topology(world_size=G)` as TorchRec plans a DMPCollection, with
    the rest taken from the world's): its ranks on a host as the layout puts them (peer_matrix: strided, or
    contiguous with use_inter_host_allreduce), each position's capacity the smallest of the ranks that hold it in
    the W / G groups. A layout that puts a group's ranks unevenly on the hosts is refused.

        >>> world = Topology(world_size=16, compute_device="cuda", local_world_size=8)
        >>> group_topology(world, 8).local_world_size, group_topology(world, 8, True).local_world_size
        (4, 8)
    """
    W, L = topology.world_size, topology.local_world_size
    matrix = peer_matrix(W, sharding_group_size, use_inter_host_allreduce)
    per_host = {(k, h): sum(1 for r in group if r // L == h) for k, group in enumerate(matrix) for h in range(W // L)}
    counts = {n for n in per_host.values() if n}
    if len(counts) != 1:
        layout = "contiguous" if use_inter_host_allreduce else "strided"
        raise ValueError(
            f"group_topology: sharding_group_size={sharding_group_size} puts a sharding group's ranks unevenly on "
            f"the hosts of {L} ranks (the {layout} layout of {W} ranks: {matrix}); choose a group size whose groups "
            f"hold the same number of ranks on each of their hosts")
    group_local = counts.pop()
    columns = list(zip(*matrix))  # position p of every group: one replica group
    hbm = [min(topology.hbm_caps()[r] for r in column) for column in columns]
    ddr = [min(topology.ddr_caps()[r] for r in column) for column in columns]
    return topology.replace(world_size=sharding_group_size, local_world_size=group_local,
                            hbm_cap=hbm if topology.uses_hbm else topology.hbm_cap, ddr_cap=ddr)


@dataclass
class TwoDimensionalCost:
    """What one sharding group's plan costs run as 2D parallelism on the world's topology.

    `group` is the group plan's PlanCost on its G ranks (the step, memory and all-to-all bytes of every group:
    they all hold the same shards); `sync_traffic` the [W, W] bytes of one sync() over global ranks; `sync_ms`
    each global rank's time in one sync, by part (`sync_parts`); the step adds the slowest rank's sync once every
    `sync_interval` steps."""

    sharding_group_size: int
    world_size: int
    sync_interval: int
    group: PlanCost
    sync_traffic: np.ndarray
    sync_parts: Dict[str, np.ndarray]  # "latency", "bytes", "copy", "shared_cores" -> [W] ms of one sync

    @property
    def replicas(self) -> int:
        """Sharding groups, so copies of each shard (the replica group's size)."""
        return self.world_size // self.sharding_group_size

    @property
    def group_step_ms(self) -> float:
        """The group's training step (forward, backward, fused update; its all-to-alls within the group)."""
        return self.group.step_time_ms

    @property
    def sync_ms(self) -> np.ndarray:
        """Each global rank's time in one sync()."""
        return sum(self.sync_parts.values())

    @property
    def sync_ms_per_step(self) -> float:
        """The slowest rank's sync, spread over the steps between two syncs."""
        return float(self.sync_ms.max()) / self.sync_interval

    @property
    def step_ms(self) -> float:
        """The estimated step: the group's step plus the sync's share of it."""
        return self.group_step_ms + self.sync_ms_per_step

    @property
    def sync_bytes(self) -> np.ndarray:
        """Bytes each global rank sends to its replicas in one sync (its own chunk, which crosses no link, left out)."""
        off = self.sync_traffic.astype(float)
        np.fill_diagonal(off, 0.0)
        return off.sum(axis=1)

    @property
    def memory_bytes(self) -> np.ndarray:
        """Each group position's memory (every group's rank at that position holds the same)."""
        return sum(self.group.memory.values())


def price_two_dimensional(plan: ShardingPlan, tables: Any, topology: Topology, sharding_group_size: int, *,
                          sync_interval: int = 1, use_inter_host_allreduce: bool = False,
                          optimizer: Any = EmbOptimType.SGD, include_optimizer_state: bool = True,
                          batch_size: Optional[int] = None, dense_bytes_per_rank: float = 0.0,
                          constraints: Optional[Mapping[str, ParameterConstraints]] = None,
                          stats: Optional[WorkloadStats] = None) -> TwoDimensionalCost:
    """Price `plan` (a plan for one sharding group's ranks 0..G-1, as DMPCollection takes it) run as 2D parallelism
    over `topology`'s W ranks: a TwoDimensionalCost.

    `tables`: the configs, a model or a DataFrame, as the planner takes them, with `constraints` and `stats` as the
    planner's (pooling factors); `optimizer`: the collections' fused optimizer, whose state sync() averages with the
    weights unless include_optimizer_state=False; `batch_size`: samples per rank per step (default: the
    topology's)."""
    W = topology.world_size
    if isinstance(sync_interval, bool) or not isinstance(sync_interval, int) or sync_interval < 1:
        raise ValueError(f"price_two_dimensional: sync_interval must be an int >= 1 (steps between syncs), got "
                         f"{sync_interval!r}")
    group_topo = group_topology(topology, sharding_group_size, use_inter_host_allreduce)
    batch = int(batch_size if batch_size is not None else topology.batch_size)
    planner_tables = collect_tables(tables, batch, constraints, stats)
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():
            outside = sorted({r for r in ps.ranks if not 0 <= r < sharding_group_size})
            if outside:
                raise ValueError(f"price_two_dimensional: table {name!r} (module {path!r}) is placed on ranks "
                                 f"{outside}, outside the sharding group's ranks 0..{sharding_group_size - 1}; give a "
                                 f"plan for one group (plan with group_topology(topology, {sharding_group_size}))")
    host_copies = topology.local_world_size // group_topo.local_world_size
    group_model = CostModel(group_topo.with_batch_size(batch), optimizer, dense_bytes_per_rank, planner_tables,
                            host_copies=host_copies)
    group = group_model.evaluate(plan, planner_tables)
    state = optimizer if include_optimizer_state else None
    traffic = np.zeros((W, W))
    for path, module_tables in tables_by_module(planner_tables).items():
        module_plan = plan.plan.get(path, {})
        traffic += sync_traffic(module_plan, [t.config for t in module_tables], W, sharding_group_size,
                                use_inter_host_allreduce, state)
    world_model = CostModel(topology.with_batch_size(batch), optimizer, dense_bytes_per_rank, planner_tables)
    return TwoDimensionalCost(sharding_group_size, W, sync_interval, group,
                              traffic, _sync_parts(world_model, plan, planner_tables, traffic, sharding_group_size,
                                                   use_inter_host_allreduce, state))


def _sync_parts(model: CostModel, plan: ShardingPlan, tables: Sequence[PlannerTable], traffic: np.ndarray,
                sharding_group_size: int, use_inter_host_allreduce: bool, optimizer: Any) -> Dict[str, np.ndarray]:
    """One sync's time per global rank, by part: its calls' latency, its bytes over each link at the collective's
    speed, the copies of its tensors into the flat buffer, its division and the copies back (three passes), and
    what a host's ranks beyond its cores add to those (CostModel.oversubscription)."""
    W = model.topology.world_size
    matrix = peer_matrix(W, sharding_group_size, use_inter_host_allreduce)
    per_link = (traffic + traffic.T) / model.bandwidth_matrix("all_reduce")
    np.fill_diagonal(per_link, 0.0)
    latency, copy = np.zeros(W), np.zeros(W)
    if len(matrix) > 1:  # one all-reduce per dtype (rectoolkit.distributed.replicas)
        alpha = model.profile.collective("all_reduce").alpha_ms
        for position, (dtypes, local_bytes) in enumerate(_rank_tensors(plan, tables, optimizer)):
            for group in matrix:
                latency[group[position]] = len(dtypes) * alpha
                copy[group[position]] = 3 * local_bytes / model.profile.write_bytes_per_ms
    parts = {"latency": latency, "bytes": per_link.sum(axis=1), "copy": copy}
    # every rank syncs at once: a host with more ranks than cores shares them (StepTime.shared_cores_ms)
    parts["shared_cores"] = (model.oversubscription - 1.0) * sum(parts.values())
    return parts


def _rank_tensors(plan: ShardingPlan, tables: Sequence[PlannerTable], optimizer: Any) -> List[Tuple[set, float]]:
    """Per group position: (dtypes, bytes) of what sync() averages there, as DMPCollection._sync_tensors lists them:
    every shard's weight, and each fused optimizer state of the shard (DATA_PARALLEL replicas: none)."""
    by_key = {t.key: t for t in tables}
    positions = 1 + max((r for module_plan in plan.plan.values() for ps in module_plan.values() for r in ps.ranks),
                        default=0)
    out: List[Tuple[set, float]] = [(set(), 0.0) for _ in range(positions)]
    for path, module_plan in plan.plan.items():
        for name, ps in module_plan.items():
            table = by_key.get((path, name))
            if table is None:
                continue
            for rank, values, dtype in synced_tensors(table.config, ps, optimizer):
                dtypes, size = out[rank]
                out[rank] = (dtypes | {dtype}, size + values * dtype.itemsize)
    return out


def compare_sharding_group_sizes(tables: Any, topology: Topology, sizes: Optional[Sequence[int]] = None, *,
                                 sync_interval: int = 1, use_inter_host_allreduce: bool = False,
                                 include_optimizer_state: bool = True, **planner_args: Any) -> "pd.DataFrame":
    """Plan `tables` for each sharding group size and price it as 2D parallelism over `topology`'s W ranks: one row
    per size G (default: every divisor of W), with the estimated step and its parts, the bytes each rank sends per
    step in its group's all-to-alls and per sync to its replicas, the largest memory of a rank, and the plan. G = W
    is the plain DistributedModelParallel (no replicas, no sync). A size whose tables do not fit in G ranks' memory
    gets `fits` False and the planner's reason, not an exception.

    `planner_args` go to EmbeddingShardingPlanner (batch_size, constraints, optimizer, stats, ...)."""
    import pandas as pd

    from rectoolkit.planner.planner import EmbeddingShardingPlanner, PlannerError

    W = topology.world_size
    sizes = [g for g in range(1, W + 1) if W % g == 0] if sizes is None else list(sizes)
    optimizer = planner_args.get("optimizer", EmbOptimType.SGD)
    rows = []
    for size in sizes:
        group = group_topology(topology, size, use_inter_host_allreduce)  # refuses a size that does not divide W
        row: Dict[str, Any] = {"sharding_group_size": size, "replicas": W // size}
        planner = EmbeddingShardingPlanner(group, **planner_args)
        try:
            plan = planner.plan(tables)
        except PlannerError as error:
            rows.append({**row, "fits": False, "why": str(error)})
            continue
        result = planner.last
        dense = result.cost_model.dense_bytes_per_rank if result is not None else 0.0
        cost = price_two_dimensional(plan, tables, topology, size, sync_interval=sync_interval,
                                     use_inter_host_allreduce=use_inter_host_allreduce, optimizer=optimizer,
                                     include_optimizer_state=include_optimizer_state, batch_size=planner.batch_size,
                                     dense_bytes_per_rank=dense, constraints=planner.constraints, stats=planner.stats)
        sent = sum(m.astype(float) for m in cost.group.traffic.values())
        np.fill_diagonal(sent, 0.0)
        rows.append({**row, "fits": True, "why": "", "step_ms": cost.step_ms, "group_step_ms": cost.group_step_ms,
                     "sync_ms": float(cost.sync_ms.max()), "sync_per_step_ms": cost.sync_ms_per_step,
                     "all_to_all_bytes_per_step": float(sent.sum(axis=1).max()),
                     "sync_bytes_per_sync": float(cost.sync_bytes.max()),
                     "max_memory_bytes": float(cost.memory_bytes.max()), "plan": plan})
    return pd.DataFrame(rows)
