"""The sharding planner: topology, constraints, options, cost model, search, report."""

from rectoolkit.planner.constraints import CacheParams, ParameterConstraints
from rectoolkit.planner.cost import CostModel, PlanCost
from rectoolkit.planner.measure import (PlanMeasurements, estimate_plan, measure_plans, pick_measured_fastest,
                                       probe_load)
from rectoolkit.planner.planner import EmbeddingShardingPlanner, PlannerError
from rectoolkit.planner.report import PlanReport
from rectoolkit.planner.stats import WorkloadStats, measure_pooling_factors
from rectoolkit.planner.topology import Topology
