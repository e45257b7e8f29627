"""The four fitted collective pairs (all-to-all, all-reduce, reduce-scatter, all-gather): the fit from synthetic
timings, profiles with four pairs and older ones with two, malformed pairs refused, every collective the engine
issues priced with its own pair, and explain() / describe() listing them."""

import json

import numpy as np
import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.traffic import COLLECTIVES
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata
from rectoolkit.planner.calibrate import CalibrationError, _buffer_collective
from rectoolkit.planner.calibration_fit import A2A_PEER_BYTES, BUFFER_BYTES, fit_collectives
from rectoolkit.planner.cost import FITTED_COLLECTIVE, CostModel
from rectoolkit.planner.planner import EmbeddingShardingPlanner
from rectoolkit.planner.profile import COLLECTIVE_KINDS, AlphaBeta, CalibrationProfile
from rectoolkit.planner.tables import collect_tables
from rectoolkit.planner.topology import Topology

PAIRS = {"all_to_all": AlphaBeta(0.5, 1000.0), "all_reduce": AlphaBeta(1.0, 2000.0),
         "reduce_scatter": AlphaBeta(0.7, 3000.0), "all_gather": AlphaBeta(0.3, 4000.0)}
OLD_PAIRS = {kind: PAIRS[kind] for kind in ("all_to_all", "all_reduce")}  # a profile from before the other two


def profile_with(collectives):
    return CalibrationProfile(collectives=dict(collectives), read_curve=((1e3, 100.0), (1e6, 10.0)),
                              write_bytes_per_ms=1000.0, step_ms=2.0, group_ms={"table_wise": 3.0}, shard_ms=0.25,
                              machine={"host": "test-host"})


TABLES = [EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=8, feature_names=["f"]),
          EmbeddingBagConfig(name="d", num_embeddings=100, embedding_dim=8, feature_names=["g"])]
# t table-wise on rank 1, d replicated on both ranks: all-to-alls and the data-parallel all-reduce
PLAN = ShardingPlan({"": {
    "t": ParameterSharding("table_wise", ranks=[1], shards=[ShardMetadata.on_rank(1, 0, 0, 100, 8)]),
    "d": ParameterSharding("data_parallel", ranks=[0, 1], shards=[ShardMetadata.on_rank(r, 0, 0, 100, 8)
                                                                   for r in (0, 1)])}})


def evaluate(profile):
    topo = Topology(world_size=2, compute_device="cpu", batch_size=4, profile=profile)
    return CostModel(topo, "sgd").evaluate(PLAN, collect_tables(TABLES, batch_size=4))


# ---- the fit ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [2, 4])
def test_fit_recovers_every_collectives_pair_from_synthetic_timings(world_size):
    W = world_size
    # bytes one rank sends + receives, by hand: an all-to-all sends (W - 1) peers their bytes and receives as much;
    # a ring reduce-scatter or all-gather of a B-byte buffer sends and receives (W - 1) / W of it, an all-reduce both
    ring = [2 * (W - 1) / W * b for b in BUFFER_BYTES]
    sizes = {"all_to_all": [2 * (W - 1) * p for p in A2A_PEER_BYTES], "all_reduce": [2 * b for b in ring],
             "reduce_scatter": ring, "all_gather": ring}
    for kind in ("all_reduce", "reduce_scatter", "all_gather"):
        assert [_buffer_collective(kind, b, W)[1] for b in BUFFER_BYTES] == pytest.approx(sizes[kind])
    truth = {"all_to_all": AlphaBeta(0.05, 1.5e6), "all_reduce": AlphaBeta(0.08, 9e5),
             "reduce_scatter": AlphaBeta(0.06, 1.2e6), "all_gather": AlphaBeta(0.04, 2.5e6)}
    samples = {kind: [(b, truth[kind].alpha_ms + b / truth[kind].bytes_per_ms) for b in sizes[kind]]
               for kind in COLLECTIVE_KINDS}
    fitted = fit_collectives(samples)
    assert set(fitted) == set(COLLECTIVE_KINDS)
    for kind, pair in truth.items():
        assert fitted[kind].alpha_ms == pytest.approx(pair.alpha_ms, abs=1e-6), kind
        assert fitted[kind].bytes_per_ms == pytest.approx(pair.bytes_per_ms, rel=1e-6), kind


def test_fit_refuses_a_collective_without_timings():
    samples = {kind: [(0, 0.5), (1000, 1.5)] for kind in ("all_to_all", "all_reduce", "all_gather")}
    with pytest.raises(CalibrationError, match=r"no timings of \['reduce_scatter'\]"):
        fit_collectives(samples)


# ---- profiles: four pairs, two pairs, malformed ----------------------------------------------------------------
def test_profile_with_four_pairs_round_trips_and_describes_each(tmp_path):
    profile = profile_with(PAIRS)
    path = profile.save(tmp_path / "four.json")
    assert set(json.loads(path.read_text())["collectives"]) == set(COLLECTIVE_KINDS)
    loaded = CalibrationProfile.load(path)
    assert loaded == profile and loaded.missing_collectives == ()
    for kind, pair in PAIRS.items():
        assert loaded.collective(kind) == pair
    text = loaded.describe()
    assert "not fitted" not in text
    assert "all_to_all: latency, bandwidth: 0.500 ms + bytes / 0.00 GB/s; prices input_dist, output_dist," in text
    assert "all_reduce: latency, bandwidth: 1.000 ms + bytes / 0.00 GB/s; prices dp_allreduce" in text
    for kind in ("reduce_scatter", "all_gather"):
        line = next(line for line in text.splitlines() if line.strip().startswith(kind + ":"))
        assert f"{PAIRS[kind].alpha_ms:.3f} ms" in line and "prices no collective the engine issues" in line


def test_a_two_pair_profile_still_loads_and_says_what_stands_in(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(profile_with(OLD_PAIRS).to_json())
    old = CalibrationProfile.load(path)
    assert old.missing_collectives == ("reduce_scatter", "all_gather")
    assert old.collective("reduce_scatter") == old.collective("all_gather") == PAIRS["all_reduce"]
    lines = {line.strip().split(":")[0]: line for line in old.describe().splitlines()}
    for kind in ("reduce_scatter", "all_gather"):
        assert "not fitted (this profile predates it): all_reduce's pair stands in, 1.000 ms" in lines[kind]
        assert "re-run `python -m rectoolkit.planner.calibrate`" in lines[kind]
    assert "not fitted" not in lines["all_to_all"] + lines["all_reduce"]
    # the engine issues no reduce-scatter or all-gather: the old profile prices a plan as the new one does
    assert evaluate(old).step_time_ms == pytest.approx(evaluate(profile_with(PAIRS)).step_time_ms, rel=1e-12)


@pytest.mark.parametrize("value,problem", [
    ({"alpha_ms": -0.1, "bytes_per_ms": 10.0}, "alpha_ms must be a finite number >= 0, got -0.1"),
    ({"alpha_ms": 0.1, "bytes_per_ms": 0.0}, "bytes_per_ms must be a finite number > 0, got 0.0"),
    ({"alpha_ms": float("nan"), "bytes_per_ms": 10.0}, "alpha_ms must be a finite number >= 0, got nan"),
    ({"alpha_ms": "0.1", "bytes_per_ms": 10.0}, "alpha_ms must be a finite number >= 0, got '0.1'"),
    ({"alpha_ms": 0.1, "bytes_per_ms": True}, "bytes_per_ms must be a finite number > 0, got True"),
    ({"alpha_ms": 0.1}, 'must be {"alpha_ms": ..., "bytes_per_ms": ...}'),
    ({"alpha_ms": 0.1, "bytes_per_ms": 10.0, "beta": 1.0}, 'must be {"alpha_ms": ..., "bytes_per_ms": ...}'),
    ([0.1, 10.0], 'must be {"alpha_ms": ..., "bytes_per_ms": ...}'),
])
def test_a_malformed_pair_is_refused_naming_its_key_and_file(tmp_path, value, problem):
    data = profile_with(PAIRS).to_dict()
    data["collectives"]["all_gather"] = value
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as error:
        CalibrationProfile.load(path)
    message = str(error.value)
    assert message.startswith(f"{path}: collectives['all_gather']") and problem in message
    assert "python -m rectoolkit.planner.calibrate" in message


def test_unknown_or_missing_collective_kinds_are_refused_naming_the_file(tmp_path):
    data = profile_with(PAIRS).to_dict()
    data["collectives"]["broadcast"] = {"alpha_ms": 0.1, "bytes_per_ms": 10.0}
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"^{path}: collectives\['broadcast'\] is not a collective kind"):
        CalibrationProfile.load(path)
    del data["collectives"]["broadcast"], data["collectives"]["all_reduce"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=rf"^{path}: collectives lacks \['all_reduce'\]"):
        CalibrationProfile.load(path)
    with pytest.raises(ValueError, match="collective 'all_gather': bytes_per_ms must be a finite number > 0"):
        profile_with({**PAIRS, "all_gather": AlphaBeta(0.1, -5.0)})


# ---- the engine's collectives, each priced with its pair -------------------------------------------------------
def test_every_engine_collective_has_one_fitted_pair():
    assert set(FITTED_COLLECTIVE) == set(COLLECTIVES)
    assert set(FITTED_COLLECTIVE.values()) <= set(COLLECTIVE_KINDS)


def test_each_collective_is_priced_with_its_own_pair():
    cost = evaluate(profile_with(PAIRS))
    # bytes / bandwidth by hand, per rank: t's ids to rank 1 (4 lengths x 4 B + 4 ids x 8 B = 48 B from each rank)
    # and its [4, 8] fp32 outputs back (128 B to each rank, and their gradients the other way), at the all-to-all's
    # 1000 B/ms; d's 800 values in 2 chunks of 400: rank i sends j 4 x (400 + 400) = 3200 B, at the all-reduce's
    # 2000 B/ms
    expected = {"input_dist": [48 / 1000, 48 / 1000], "output_dist": [128 / 1000, 128 / 1000],
                "output_dist_backward": [128 / 1000, 128 / 1000], "dp_allreduce": [6400 / 2000, 6400 / 2000]}
    for name, ms in cost.comm_ms.items():
        np.testing.assert_allclose(ms, expected.get(name, [0.0, 0.0]), rtol=1e-12, err_msg=name)
    # latency: the table-wise group's 4 all-to-all calls, the replicated group's one all-reduce on 2 ranks
    latency = {g.sharding_type: g.latency_ms for g in cost.step.groups}
    assert latency == pytest.approx({"table_wise": 4 * 0.5, "data_parallel": 1.0})
    # the reduce-scatter and all-gather pairs price nothing the engine issues today
    other = profile_with({**PAIRS, "reduce_scatter": AlphaBeta(50.0, 1.0), "all_gather": AlphaBeta(50.0, 1.0)})
    assert evaluate(other).step_time_ms == pytest.approx(cost.step_time_ms, rel=1e-12)
    # a slower all-reduce slows exactly the data-parallel gradients
    slower = evaluate(profile_with({**PAIRS, "all_reduce": AlphaBeta(1.0, 1000.0)}))
    assert slower.comm_ms["dp_allreduce"] == pytest.approx(2 * cost.comm_ms["dp_allreduce"])
    assert slower.comm_ms["input_dist"] == pytest.approx(cost.comm_ms["input_dist"])


# ---- explain() ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pairs", [PAIRS, OLD_PAIRS], ids=["four pairs", "two pairs"])
def test_explain_lists_the_four_pairs_and_what_each_prices(pairs):
    topo = Topology(world_size=2, compute_device="cpu", batch_size=4, profile=profile_with(pairs))
    planner = EmbeddingShardingPlanner(topo)
    planner.plan(TABLES)
    lines = planner.explain().splitlines()
    rows = {kind: [line for line in lines if line.strip().startswith(f"{kind}: latency, bandwidth:")]
            for kind in COLLECTIVE_KINDS}
    assert all(len(found) == 1 for found in rows.values()), rows
    assert "prices input_dist, output_dist, output_dist_intra, output_dist_inter, output_dist_backward" in \
        rows["all_to_all"][0]
    assert rows["all_reduce"][0].endswith("prices dp_allreduce")
    for kind in ("reduce_scatter", "all_gather"):
        assert "prices no collective the engine issues" in rows[kind][0]
        assert ("not fitted" in rows[kind][0]) == (kind not in pairs)
        assert f"{profile_with(pairs).collective(kind).alpha_ms:.3f} ms" in rows[kind][0]
