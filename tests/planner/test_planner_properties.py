"""Laws of every plan: shards tile each table exactly, memory stays within capacity, constraints hold."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rectoolkit.modules.configs import EmbeddingBagConfig, EmbeddingConfig
from rectoolkit.plan.types import ShardingType
from rectoolkit.planner import EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology

TYPES = [t.value for t in ShardingType]
KERNELS = ["fused", "fused_uvm", "fused_uvm_caching", "dense"]


@st.composite
def instances(draw):
    world_size = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    local = draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    device = draw(st.sampled_from(["cuda", "cpu"]))
    n = draw(st.integers(1, 6))
    tables, constraints = [], {}
    for i in range(n):
        rows = draw(st.integers(1, 300))
        dim = draw(st.sampled_from([4, 8, 12, 16, 32]))
        pooled = draw(st.booleans()) or i == 0
        cls = EmbeddingBagConfig if pooled else EmbeddingConfig
        tables.append(cls(name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"]))
        if draw(st.booleans()):
            types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
            kernels = draw(st.none() | st.lists(st.sampled_from(KERNELS), min_size=1, max_size=3, unique=True))
            constraints[f"t{i}"] = ParameterConstraints(
                sharding_types=types, compute_kernels=kernels, min_partition=draw(st.sampled_from([None, 4, 8])),
                pooling_factors=[draw(st.floats(0.0, 20.0))])
    hbm = draw(st.integers(2_000, 400_000))
    topo = Topology(world_size=world_size, local_world_size=local, compute_device=device, hbm_cap=hbm,
                    ddr_cap=draw(st.integers(20_000, 2_000_000)), batch_size=draw(st.integers(1, 16)))
    objective = draw(st.sampled_from(["time", "time", "memory", "bytes"]))
    return topo, tables, constraints, objective


def assert_tiles(ps, rows, cols, world_size):
    """Independent check on a boolean grid: every cell in exactly one shard (replicas: every rank once)."""
    assert all(0 <= shard.rank < world_size for shard in ps.shards)
    if ps.sharding_type == "data_parallel":
        assert sorted(shard.rank for shard in ps.shards) == list(range(world_size))
        assert all(shard.shard_offsets == [0, 0] and shard.shard_sizes == [rows, cols] for shard in ps.shards)
        return
    count = np.zeros((rows, cols), dtype=int)
    for shard in ps.shards:
        (r0, c0), (nr, nc) = shard.shard_offsets, shard.shard_sizes
        assert r0 + nr <= rows and c0 + nc <= cols
        count[r0:r0 + nr, c0:c0 + nc] += 1
    assert (count == 1).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_plans_tile_fit_and_honour_constraints(instance):
    topo, tables, constraints, objective = instance
    planner = EmbeddingShardingPlanner(topo, constraints=constraints, objective=objective, optimizer="adagrad")
    try:
        plan = planner.plan(tables)
    except PlannerError as error:  # does not fit, or constraints allow no option for a table
        assert error.tables and all(name in str(error) for name in error.tables)
        assert "do not fit" in str(error) or "constraints leave no sharding option for table" in str(error)
        return
    report = planner.report()
    assert (report.memory["hbm_bytes"] <= report.memory["hbm_cap_bytes"] + 1e-6).all()
    assert (report.memory["ddr_bytes"] <= report.memory["ddr_cap_bytes"] + 1e-6).all()
    # a lower bound computed here: the weights a rank holds (fp32) never exceed its total capacity
    weights = np.zeros(topo.world_size)
    for table in tables:
        ps = plan.plan[""][table.name]
        assert_tiles(ps, table.num_embeddings, table.embedding_dim, topo.world_size)
        for shard in ps.shards:
            weights[shard.rank] += 4 * shard.shard_sizes[0] * shard.shard_sizes[1]
        c = constraints.get(table.name)
        if c is not None:
            assert ps.sharding_type in c.sharding_types
            if c.compute_kernels is not None:
                assert ps.compute_kernel in c.compute_kernels
        if ps.sharding_type == "data_parallel":
            assert ps.compute_kernel == "dense"
        if not isinstance(table, EmbeddingBagConfig):
            assert ps.sharding_type in ("table_wise", "column_wise", "row_wise", "data_parallel")
    caps = np.array(topo.hbm_caps()) + np.array(topo.ddr_caps())
    assert (weights <= caps + 1e-6).all()
