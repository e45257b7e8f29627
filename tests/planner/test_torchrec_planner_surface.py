"""EmbeddingShardingPlanner's TorchRec arguments beside TorchRec 1.8's planner, on the same module and sharders.

storage_reservation (FixedPercentage / FixedAbsolute / Heuristical): the same tables fit or do not fit as in
TorchRec; get_default_sharders() plans a float collection with the float sharder (the quantized sharder of the same
list planned it with "quant" kernels); ParameterConstraints' feature_names and device_group are honoured or refused,
never ignored. Each case is one TorchRec planner call and the same rectoolkit call.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, PlannerError, Topology
from rectoolkit.distributed.planner import storage_reservations as ours
from rectoolkit.distributed.sharding_plan import get_default_sharders

ROWS, DIM = 1000, 64  # 256,000 bytes per table: one per rank fits 300,000 bytes of HBM, not 80% of it


def _plan_summary(plan):
    return {table: (ps.sharding_type, ps.compute_kernel, list(ps.ranks))
            for table, ps in sorted(plan.plan[""].items())}


def _plan(lib_name, reservation=None, hbm_cap=300_000, constraints=None):
    """(summary or "no fit") of one planner call, with `lib_name`'s classes throughout."""
    if lib_name == "torchrec":
        torchrec = pytest.importorskip("torchrec")
        from torchrec.distributed import planner as their_planner
        from torchrec.distributed.planner import storage_reservations as theirs
        from torchrec.distributed.sharding_plan import get_default_sharders as their_sharders

        lib, planner_mod, reservations, sharders, error = (torchrec, their_planner, theirs, their_sharders,
                                                           their_planner.types.PlannerError)
    else:
        lib, planner_mod, reservations, sharders, error = rtk, None, ours, get_default_sharders, PlannerError
    EBC, Config = lib.EmbeddingBagCollection, lib.EmbeddingBagConfig
    Planner = planner_mod.EmbeddingShardingPlanner if planner_mod else EmbeddingShardingPlanner
    Topo = planner_mod.Topology if planner_mod else Topology
    Constraints = planner_mod.ParameterConstraints if planner_mod else ParameterConstraints
    ebc = EBC(tables=[Config(name=f"t{i}", num_embeddings=ROWS, embedding_dim=DIM, feature_names=[f"f{i}"])
                      for i in range(2)], device=torch.device("meta"))
    constraints = constraints if constraints is not None else {
        f"t{i}": dict(compute_kernels=["fused"], sharding_types=["table_wise"]) for i in range(2)}
    kind, args = reservation or ("FixedPercentageStorageReservation", (0.0,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchRec's HeuristicalStorageReservation warns about itself
        planner = Planner(topology=Topo(world_size=2, compute_device="cuda", hbm_cap=hbm_cap), batch_size=8,
                          constraints={t: Constraints(**c) for t, c in constraints.items()},
                          storage_reservation=getattr(reservations, kind)(*args))
    try:
        return _plan_summary(planner.plan(ebc, sharders()))
    except error:
        return "no fit"


@pytest.mark.torchrec
@pytest.mark.parametrize("reservation", [
    ("FixedPercentageStorageReservation", (0.0,)), ("FixedPercentageStorageReservation", (0.2,)),
    ("HeuristicalStorageReservation", (0.2,)), ("HeuristicalStorageReservation", (0.01,)),
    ("FixedAbsoluteStorageReservation", (30_000,)), ("FixedAbsoluteStorageReservation", (60_000,))])
def test_storage_reservations_fit_what_torchrecs_fit(reservation):
    theirs = _plan("torchrec", reservation)
    assert _plan("rectoolkit", reservation) == theirs
    # hand-checked: 256,000 bytes fit 300,000 less 1% (or 30,000), not less 20% (or 60,000)
    assert (theirs == "no fit") == (reservation[1][0] in (0.2, 60_000))


@pytest.mark.torchrec
def test_default_sharders_plan_a_float_collection_with_fused_kernels():
    constraints = {"t0": dict(sharding_types=["row_wise"]), "t1": dict(sharding_types=["column_wise"], min_partition=32)}
    theirs = _plan("torchrec", hbm_cap=10 ** 9, constraints=constraints)
    assert _plan("rectoolkit", hbm_cap=10 ** 9, constraints=constraints) == theirs
    assert theirs == {"t0": ("row_wise", "fused", [0, 1]), "t1": ("column_wise", "fused", [0, 1])}


@pytest.mark.torchrec
def test_a_dense_kernel_constraint_makes_the_table_data_parallel_as_in_torchrec():
    """TorchRec's golden data-parallel example forces a table data-parallel with compute_kernels=["dense"] (its
    sharders offer "dense" for DATA_PARALLEL only); asked for table-wise as well, no option is left in either."""
    wanted = {"t0": dict(compute_kernels=["dense"]), "t1": dict(compute_kernels=["fused"])}
    theirs = _plan("torchrec", hbm_cap=10 ** 9, constraints=wanted)
    ours = _plan("rectoolkit", hbm_cap=10 ** 9, constraints=wanted)
    assert ours["t0"] == theirs["t0"] == ("data_parallel", "dense", [0, 1])
    assert ours["t1"][1] == theirs["t1"][1] == "fused"
    clash = {"t0": dict(compute_kernels=["dense"], sharding_types=["table_wise"]), "t1": {}}
    with pytest.raises(RuntimeError, match="No available sharding type and compute kernel combination"):
        _plan("torchrec", hbm_cap=10 ** 9, constraints=clash)
    with pytest.raises(PlannerError, match="constraints leave no sharding option for table 't0'"):
        EmbeddingShardingPlanner(Topology(world_size=2), constraints={
            "t0": ParameterConstraints(**clash["t0"])}).plan([rtk.EmbeddingBagConfig(
                name="t0", num_embeddings=ROWS, embedding_dim=DIM, feature_names=["f0"])])


def test_reservation_percentage_is_checked_and_the_planner_refuses_torchrecs_own():
    with pytest.raises(ValueError, match="percentage=1.5"):
        ours.HeuristicalStorageReservation(1.5)
    with pytest.raises(TypeError, match="storage_reservation=object is not one of rectoolkit's"):
        EmbeddingShardingPlanner(Topology(world_size=2), storage_reservation=object())
    planner = EmbeddingShardingPlanner(Topology(world_size=2), heuristical_storage_reservation_percentage=0.3)
    assert isinstance(planner.storage_reservation, ours.HeuristicalStorageReservation)


def test_feature_names_and_device_group_are_honoured_or_refused():
    ebc = rtk.EmbeddingBagCollection(tables=[rtk.EmbeddingBagConfig(
        name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0", "g0"])], device=torch.device("meta"))
    cuda = Topology(world_size=2, compute_device="cuda")
    with pytest.raises(ValueError, match=r"table 't0': feature_names=\['g0', 'f0'\] but the table's features are"):
        EmbeddingShardingPlanner(cuda, constraints={"t0": ParameterConstraints(feature_names=["g0", "f0"])}).plan(ebc)
    with pytest.raises(PlannerError, match="t0 \\(device_group='cpu'\\).*compute_device 'cuda'"):
        EmbeddingShardingPlanner(cuda, constraints={"t0": ParameterConstraints(device_group="cpu")}).plan(ebc)
    same = {"t0": ParameterConstraints(feature_names=["f0", "g0"], device_group="cuda")}
    assert "t0" in EmbeddingShardingPlanner(cuda, constraints=same).plan(ebc).plan[""]


def test_stats_printers_log_the_plan_or_nothing(caplog):
    from rectoolkit.distributed.planner.stats import EmbeddingStats, NoopEmbeddingStats

    ebc = rtk.EmbeddingBagCollection(tables=[rtk.EmbeddingBagConfig(
        name="t0", num_embeddings=10, embedding_dim=4, feature_names=["f0"])], device=torch.device("meta"))
    topology = Topology(world_size=2, compute_device="cpu")
    with caplog.at_level("INFO", logger="rectoolkit.planner"):
        EmbeddingShardingPlanner(topology, stats=NoopEmbeddingStats()).plan(ebc)
        assert not caplog.records
        EmbeddingShardingPlanner(topology, stats=[EmbeddingStats()]).plan(ebc)  # TorchRec takes a list too
        assert "t0" in caplog.text
    with pytest.raises(TypeError, match=r"stats=\['dict'\] is neither a WorkloadStats"):
        EmbeddingShardingPlanner(topology, stats={"batch_size": 8})
