"""The cost model prices what a DATA_PARALLEL replica runs (TorchRec 1.8's dense kernel): its backward accumulates
gradient rows per id, with no fused update (SGD's measured pass, the nearest), whatever the fused optimizer; the
dense optimizer's update over the whole replica is the dense gradient's whole-shard term. Other shards keep their
fused optimizer's backward + update."""

from __future__ import annotations

import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.planner.cost import CostModel
from rectoolkit.planner.profile import AlphaBeta, CalibrationProfile, LookupTerms
from rectoolkit.planner.tables import collect_tables
from rectoolkit.planner.topology import Topology

SGD_TERMS, ADAGRAD_TERMS = LookupTerms(0.001, 1.5, 0.0015), LookupTerms(0.004, 4.0, 0.004)
PROFILE = CalibrationProfile(
    collectives={"all_to_all": AlphaBeta(0.5, 1000.0), "all_reduce": AlphaBeta(1.0, 2000.0),
                 "reduce_scatter": AlphaBeta(0.7, 3000.0), "all_gather": AlphaBeta(0.3, 4000.0)},
    read_curve=((1e3, 100.0), (1e6, 10.0)), write_bytes_per_ms=1000.0, forward=LookupTerms(0.0, 1.0, 0.001),
    backward_terms={"sgd": SGD_TERMS, "adagrad": ADAGRAD_TERMS})


def _models():
    topology = Topology(world_size=2, compute_device="cpu", batch_size=16, profile=PROFILE)
    table = collect_tables([EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=8, feature_names=["f"])],
                           16)[0]
    return table, {name: CostModel(topology, name) for name in ("sgd", "adagrad")}


def test_a_replicas_backward_is_priced_without_the_fused_update():
    table, models = _models()
    replica = {name: m.shard_lookup_ms(table, 100, 8, "data_parallel", "dense", None) for name, m in models.items()}
    owned = {name: m.shard_lookup_ms(table, 100, 8, "table_wise", "fused", None) for name, m in models.items()}
    assert replica["adagrad"] == replica["sgd"]  # the fused optimizer does not run on a replica
    assert owned["adagrad"][1] > owned["sgd"][1]  # it does on a table-wise shard
    # by hand: SGD's pass, on the replica's ids (its own rank's), + the whole-shard dense gradient term
    ids = table.ids_per_rank
    model = models["adagrad"]
    read_ms_per_byte = float(PROFILE.read_ms_per_byte(max(100 * 8 * 4, model.rank_share_bytes)))
    rows_read = float(PROFILE.rows_read(ids, 100))
    expected = float(SGD_TERMS.cost_ms(ids, 8 * 4, read_ms_per_byte, 4 * 8 * table.samples_per_rank, rows_read)) \
        + 3 * 100 * 8 * 4 / PROFILE.write_bytes_per_ms
    assert replica["adagrad"][1] == pytest.approx(expected)


def test_a_plan_with_a_replica_prices_its_backward_alike():
    table, models = _models()
    plan = {"t": ParameterSharding("data_parallel", "dense", ranks=[0, 1],
                                   shards=[ShardMetadata.on_rank(r, 0, 0, 100, 8) for r in range(2)])}
    costs = {name: m.evaluate(ShardingPlan({"": plan}), [table]) for name, m in models.items()}
    assert costs["adagrad"].time_ms.tolist() == costs["sgd"].time_ms.tolist()
    assert costs["adagrad"].step_time_ms == costs["sgd"].step_time_ms


def test_the_calibrations_training_step_updates_a_replica_by_a_dense_step():
    # what the fixed costs of a DATA_PARALLEL plan are measured on: the replica's SGD step runs, its .grad cleared
    import torch

    from rectoolkit.distributed.comm import ShardingEnv
    from rectoolkit.planner.calibrate import _sharded_collection, _step_call, _tiny_parameter_sharding

    plan = {"a": _tiny_parameter_sharding("data_parallel", 8, 4, 1)}
    sharded = _sharded_collection(ShardingEnv.local(), plan, 8, 4)
    replica = sharded.embedding_bags["a"].weight
    expected = replica.detach().clone()
    expected[:4] -= 1e-6  # loss = the sum of rows 0..3 (one id per bag): gradient 1 there, SGD's lr 1e-6
    _step_call(sharded, plan, torch.arange(4), torch.ones(4, dtype=torch.int32))()
    assert replica.grad is None
    torch.testing.assert_close(replica.detach(), expected, atol=0, rtol=0)
