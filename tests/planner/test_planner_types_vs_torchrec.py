"""Topology and ParameterConstraints beside TorchRec 1.8's: the same constructor calls give the same `devices`
(DeviceHardware with Storage and Perf), `intra_group_size`, defaults (ParameterConstraints' pooling_factors is
[1.0]) and hashability; an edited `topology.devices[r].storage` is planned for, as TorchRec's planner reads it.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

import rectoolkit as rtk
from rectoolkit.distributed.planner import EmbeddingShardingPlanner, PlannerError
from rectoolkit.distributed.planner import types as ours

torchrec_types = pytest.importorskip("torchrec.distributed.planner.types")
pytestmark = pytest.mark.torchrec

TOPOLOGIES = [dict(world_size=2, compute_device="cpu"),
              dict(world_size=4, compute_device="cuda", local_world_size=2),
              dict(world_size=2, compute_device="cuda", hbm_cap=1000, ddr_cap=2000, ssd_cap=3000),
              dict(world_size=4, compute_device="cuda", local_world_size=2, pod_size=1)]


def _devices(topology) -> list:
    return [(d.rank, (d.storage.hbm, d.storage.ddr, d.storage.ssd), dataclasses.astuple(d.perf), d.perf.total)
            for d in topology.devices]


@pytest.mark.parametrize("kwargs", TOPOLOGIES)
def test_topology_devices_are_torchrecs(kwargs):
    logging.getLogger("torchrec.distributed.planner.types").setLevel(logging.ERROR)  # its "use the factory" warning
    theirs, mine = torchrec_types.Topology(**kwargs), ours.Topology(**kwargs)
    assert _devices(mine) == _devices(theirs)
    assert mine.intra_group_size == theirs.intra_group_size
    assert [type(d).__name__ for d in mine.devices] == ["DeviceHardware"] * kwargs["world_size"]
    first = mine.devices[0]
    assert first.storage + first.storage == ours.Storage(*(2 * v for v in dataclasses.astuple(first.storage)))
    assert first.storage.fits_in(first.storage) and hash(first) == hash(ours.DeviceHardware(0, first.storage,
                                                                                             first.perf))


def test_parameter_constraints_defaults_are_torchrecs():
    theirs, mine = torchrec_types.ParameterConstraints(), ours.ParameterConstraints()
    for field in dataclasses.fields(theirs):
        assert getattr(mine, field.name) == getattr(theirs, field.name), field.name
    assert mine.pooling_factors == [1.0]
    assert hash(mine) == hash(ours.ParameterConstraints())  # hashable, as TorchRec's
    assert {mine, ours.ParameterConstraints(sharding_types=["table_wise"])} != {mine}


def _tables(features_per_table: int = 2):
    return [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=1000, embedding_dim=64,
                                   feature_names=[f"f{i}_{k}" for k in range(features_per_table)]) for i in range(2)]


def test_default_pooling_factors_fit_a_table_of_several_features():
    """TorchRec's default [1.0] on a two-feature table is the default, not one factor for two features."""
    plan = EmbeddingShardingPlanner(ours.Topology(world_size=2, compute_device="cpu"), batch_size=8,
                                    constraints={"t0": ours.ParameterConstraints(sharding_types=["table_wise"])}
                                    ).plan(_tables())
    assert plan.plan[""]["t0"].sharding_type == "table_wise"
    with pytest.raises(ValueError, match="pooling_factors has 1 entries but the table has 2 features"):
        EmbeddingShardingPlanner(ours.Topology(world_size=2, compute_device="cpu"), batch_size=8,
                                 constraints={"t0": ours.ParameterConstraints(pooling_factors=[3.0])}).plan(_tables())


def test_an_edited_device_storage_is_planned_for():
    """Two 256,000-byte tables on CPU ranks of 600,000 bytes each: one per rank. Shrink rank 1's memory to nothing and
    the planner (TorchRec's too: its partitioner reads devices[r].storage) must put both on rank 0; shrink rank 0 to
    300,000 bytes too and they do not fit."""
    def ranks_used(topology):
        plan = EmbeddingShardingPlanner(topology, batch_size=8).plan(_tables(1))
        return {r for ps in plan.plan[""].values() for r in ps.ranks}

    topology = ours.Topology(world_size=2, compute_device="cpu", ddr_cap=600_000)
    assert ranks_used(topology) == {0, 1}
    topology.devices[1].storage.ddr = 0
    assert ranks_used(topology) == {0}
    assert topology.with_batch_size(16).devices[1].storage.ddr == 0  # a copy keeps the edit
    topology.devices[0].storage.ddr = 300_000
    with pytest.raises(PlannerError):
        ranks_used(topology)
