"""The step estimate: what per-rank sums cannot hold (rectoolkit.planner.cost builds it; docs/cost_model.md).

A step is a fixed cost plus the plan's sharding-type groups one after another, each waiting for its slowest rank at
its collectives: per group a fixed cost (the engine's Python and kernel calls), its collective calls' latency, and
its lookups and bytes on the slowest rank of each phase. Other work on the machine stretches the whole step by the
load probe's factors (`step_at_load`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

from rectoolkit.plan.types import EmbeddingComputeKernel as K
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardingType
from rectoolkit.planner.profile import COLLECTIVE_KINDS
from rectoolkit.planner.tables import PlannerTable


@dataclass
class GroupTime:
    """One sharding-type group of one collection in a step: it runs after the previous group, in order
    input_dist -> lookup -> output_dist forward, and output_dist backward -> lookup backward + update."""

    module_path: str
    sharding_type: str
    fixed_ms: float  # the group's own work (Python, kernel calls): profile.group_ms
    latency_ms: float  # its collective calls x their alpha
    lookup_fwd_ms: float  # the slowest rank's forward lookups (or the host's when local ranks share cores)
    comm_fwd_ms: float  # the slowest rank's forward bytes / bandwidth
    lookup_bwd_ms: float
    comm_bwd_ms: float

    @property
    def total_ms(self) -> float:
        return (self.fixed_ms + self.latency_ms + self.lookup_fwd_ms + self.comm_fwd_ms + self.lookup_bwd_ms
                + self.comm_bwd_ms)


def step_at_load(quiet_ms: float, load_share: float, load_factor: float, load_factor_alone: float = 1.0) -> float:
    """A step's time at a machine load: quiet_ms x (load_factor_alone + (load_factor - load_factor_alone) x load_share).

    `load_factor` and `load_factor_alone` are the load probe's (rectoolkit.planner.load): how much longer a step takes
    now whose local ranks are all busy, and one whose rank 0 works while the others only wait in the collectives.
    `load_share` (StepTime.load_share) places a plan between the two: the other local ranks' busy share beside its
    busiest rank. Other work slows a rank by competing for the cores; the less its peers on the host keep busy, the
    more of a core is left for it (under one busy loop on the 2-core machine the probe's factors were 2.1 and
    1.2-1.3; the plan with every table on rank 0 ran 1.4-1.5x its quiet estimate where the balanced plans ran
    2.0-2.2x). With load_factor_alone 1.0 (a Topology given only load_factor) a plan with idle peers is priced quiet.

        >>> step_at_load(10.0, 1.0, 2.0), step_at_load(10.0, 0.25, 2.0), step_at_load(10.0, 0.25, 2.0, 1.2)
        (20.0, 12.5, 14.0)
        >>> step_at_load(10.0, 0.0, 2.0, 1.2), step_at_load(10.0, 0.25, 1.0)
        (12.0, 10.0)
    """
    return quiet_ms * (load_factor_alone + (load_factor - load_factor_alone) * load_share)


@dataclass
class StepTime:
    """The step estimate: a fixed cost per step plus the groups one after another (each waits for its slowest
    rank at its collectives)."""

    step_fixed_ms: float
    groups: List[GroupTime]
    load_factor: float = 1.0  # Topology.load_factor: the machine's current slowdown from other work
    load_share: float = 1.0  # of the load factor, the share this plan gets (step_at_load; CostModel.load_share)
    load_factor_alone: float = 1.0  # Topology.load_factor_alone: the slowdown when the other ranks only wait
    oversubscription: float = 1.0  # a host's busy ranks over its cores, at least 1 (CostModel.oversubscription)

    @property
    def shared_cores_ms(self) -> float:
        """What a host's ranks beyond its cores add: every rank's CPU work between its lookups (the fixed costs, the
        collectives' latency and bytes, which gloo moves with the CPU) takes `oversubscription` times as long when
        the host's ranks all do it at once on fewer cores. The lookups share the cores already (CostModel._phase_ms).

            >>> group = GroupTime("", "table_wise", 1.0, 0.5, 4.0, 0.25, 2.0, 0.25)
            >>> StepTime(1.0, [group], oversubscription=2.0).shared_cores_ms
            3.0
        """
        cpu = self.step_fixed_ms + sum(g.fixed_ms + g.latency_ms + g.comm_fwd_ms + g.comm_bwd_ms for g in self.groups)
        return (self.oversubscription - 1.0) * cpu

    @property
    def quiet_ms(self) -> float:
        """The step on a machine of its own: fixed cost plus the groups (and their ranks' share of the cores)."""
        return self.step_fixed_ms + sum(g.total_ms for g in self.groups) + self.shared_cores_ms

    @property
    def load_ms(self) -> float:
        """What the machine's load adds: step_at_load(quiet_ms, load_share, load_factor, load_factor_alone) -
        quiet_ms."""
        return step_at_load(self.quiet_ms, self.load_share, self.load_factor, self.load_factor_alone) - self.quiet_ms

    @property
    def total_ms(self) -> float:
        return self.quiet_ms + self.load_ms

    def parts(self) -> Dict[str, float]:
        """ms by term, summed over groups (the report's breakdown)."""
        names = ("fixed_ms", "latency_ms", "lookup_fwd_ms", "comm_fwd_ms", "lookup_bwd_ms", "comm_bwd_ms")
        parts = {"step_fixed_ms": self.step_fixed_ms}
        parts.update({name: sum(getattr(g, name) for g in self.groups) for name in names})
        parts["shared_cores_ms"] = self.shared_cores_ms
        parts["load_ms"] = self.load_ms
        return parts


def collective_calls(sharding_type: ShardingType, num_tables: int, world_size: int) -> Dict[str, int]:
    """Calls one group makes per training step (rectoolkit.distributed), by the fitted collective kind whose alpha
    prices each call: input_dist is a metadata and a data all-to-all, output_dist one all-to-all forward and one
    backward (two each for the two-level table-row-wise and grid outputs); data-parallel all-reduces its gradients
    once. The engine calls no backend reduce-scatter or all-gather, so those kinds count 0; on one rank it calls
    no collective at all (rectoolkit.distributed.comm copies what it would send to itself).

    >>> collective_calls(ShardingType.TABLE_WISE, 3, 2), collective_calls(ShardingType.TABLE_WISE, 3, 1)["all_to_all"]
    ({'all_to_all': 4, 'all_reduce': 0, 'reduce_scatter': 0, 'all_gather': 0}, 0)
    """
    calls = dict.fromkeys(COLLECTIVE_KINDS, 0)
    if world_size == 1:
        return calls
    if sharding_type == ShardingType.DATA_PARALLEL:
        calls["all_reduce"] = 1
    elif sharding_type in (ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD):
        calls["all_to_all"] = 6
    else:
        calls["all_to_all"] = 4
    return calls


def engine_groups(module_plan: Dict[str, ParameterSharding], tables: Dict[str, PlannerTable]) -> int:
    """How many groups the sharded collection runs for these tables of one sharding type: one per plain ("dense"
    kernel) or fused weights and per dtype (FP32 tables apart from the others, rectoolkit.distributed.sharded_ebc),
    each with its own input_dist and output_dist. Data-parallel replicas split by dtype only.

    >>> import dataclasses
    >>> from rectoolkit.modules.configs import DataType, EmbeddingBagConfig
    >>> fp32 = PlannerTable("", EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=4, feature_names=["f"]),
    ...                     [1.0], [8], False)
    >>> fp16 = dataclasses.replace(fp32, config=dataclasses.replace(fp32.config, name="b", data_type=DataType.FP16))
    >>> tw = ParameterSharding("table_wise", "fused", ranks=[0])
    >>> engine_groups({"a": tw, "b": tw}, {"a": fp32, "b": fp16})
    2
    >>> engine_groups({"a": tw, "b": dataclasses.replace(tw, compute_kernel="dense")}, {"a": fp32, "b": fp32})
    2
    """
    runs = set()
    for name, ps in module_plan.items():
        table = tables.get(name)
        fp32 = table is None or getattr(table.config.data_type, "name", "FP32") == "FP32"
        plain = ps.compute_kernel == K.DENSE.value and ps.sharding_type != ShardingType.DATA_PARALLEL.value
        runs.add((plain, fp32))
    return max(1, len(runs))


def plan_groups(plan: ShardingPlan) -> List[Tuple[str, str]]:
    """(module path, sharding type) of every group, in the order the sharded collection runs them."""
    order = [t.value for t in ShardingType]
    groups = []
    for path, module_plan in plan.plan.items():
        kinds = {ps.sharding_type for ps in module_plan.values()}
        groups += [(path, kind) for kind in sorted(kinds, key=lambda k: order.index(k) if k in order else len(order))]
    return groups
