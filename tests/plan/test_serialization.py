"""Plan JSON: round trip, schema version, and clear errors for files that are not (valid) plans."""

import json

import pytest

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.plan.serialization import (SCHEMA_VERSION, PlanValidationError, load_plan, plan_from_json,
                                           plan_to_dict, plan_to_json, save_plan, validate_plan)
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata

TABLES = [EmbeddingBagConfig(name="a", num_embeddings=10, embedding_dim=8, feature_names=["fa"]),
          EmbeddingBagConfig(name="b", num_embeddings=6, embedding_dim=4, feature_names=["fb"])]


def s(rank, offsets, sizes):
    return ShardMetadata(offsets, sizes, f"rank:{rank}/cpu")


def make_plan():
    return ShardingPlan({"": {
        "a": ParameterSharding("row_wise", "fused", [0, 1], [s(0, [0, 0], [5, 8]), s(1, [5, 0], [5, 8])]),
        "b": ParameterSharding("data_parallel", "dense", [0, 1], [s(0, [0, 0], [6, 4]), s(1, [0, 0], [6, 4])]),
    }, "tower": {
        "a": ParameterSharding("column_wise", "fused_uvm_caching", [1, 0], [s(1, [0, 0], [10, 4]), s(0, [0, 4], [10, 4])],
                               cache_load_factor=0.3),
    }})


def test_round_trip_through_a_file(tmp_path):
    plan = make_plan()
    shapes = {("", "a"): (10, 8), ("", "b"): (6, 4), ("tower", "a"): (10, 8)}
    path = save_plan(plan, tmp_path / "plan.json", tables=shapes)
    data = json.loads(path.read_text())
    assert data["format"] == "rectoolkit.sharding_plan" and data["schema_version"] == SCHEMA_VERSION
    loaded = load_plan(path)
    assert loaded == plan
    assert str(loaded) == str(plan)
    assert loaded.plan["tower"]["a"].cache_load_factor == 0.3


def test_not_a_plan(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(PlanValidationError, match=r"x.json is not a rectoolkit sharding plan"):
        load_plan(path)
    path.write_text("not json at all")
    with pytest.raises(PlanValidationError, match="not valid JSON"):
        load_plan(path)
    with pytest.raises(FileNotFoundError):
        load_plan(tmp_path / "missing.json")


def test_newer_schema_is_refused():
    data = plan_to_dict(make_plan())
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(PlanValidationError, match="schema_version"):
        plan_from_json(json.dumps(data))


def test_plan_for_other_tables():
    plan = ShardingPlan({"": {"a": make_plan().plan[""]["a"]}})
    text = plan_to_json(plan)
    with pytest.raises(PlanValidationError, match=r"plan for other tables: no entry for \['b'\]"):
        plan_from_json(text, tables=TABLES)
    other = [EmbeddingBagConfig(name="a", num_embeddings=12, embedding_dim=8, feature_names=["fa"])]
    with pytest.raises(PlanValidationError, match="do not tile|in no shard"):
        plan_from_json(text, tables=other)  # same name, 12 rows: rows 10..12 are in no shard


@pytest.mark.parametrize("shards,message", [
    ([s(0, [0, 0], [5, 8]), s(1, [6, 0], [4, 8])], "gap at rows 5..6"),
    ([s(0, [0, 0], [6, 8]), s(1, [5, 0], [5, 8])], "overlap at rows 5..6"),
    ([s(0, [0, 0], [10, 4])], "rows 0..10 of columns 4..8 are in no shard"),
    ([s(0, [0, 0], [10, 8]), s(1, [0, 8], [10, 2])], "is 10 x 8 but a shard on rank 1"),
])
def test_shards_must_tile_exactly(shards, message):
    plan = ShardingPlan({"": {"a": ParameterSharding("column_wise", "fused", [0], shards)}})
    with pytest.raises(PlanValidationError, match=message):
        validate_plan(plan, {"a": (10, 8)})


def test_replicas_and_ranks_are_checked():
    bad = ShardingPlan({"": {"b": ParameterSharding("data_parallel", "dense", [0, 1],
                                                    [s(0, [0, 0], [6, 4]), s(1, [0, 0], [3, 4])])}})
    with pytest.raises(PlanValidationError, match="replica"):
        validate_plan(bad, {"b": (6, 4)})
    with pytest.raises(PlanValidationError, match="table a: shard 1 is placed on rank 1 but the world size is 1"):
        validate_plan(make_plan(), world_size=1)


def test_a_file_whose_data_parallel_entry_has_another_kernel_is_refused_naming_the_table():
    # TorchRec 1.8 cannot run such an entry either (its DATA_PARALLEL sharding fails inside fbgemm's fused kernel)
    data = plan_to_dict(make_plan())
    data["plan"][""]["b"]["compute_kernel"] = "fused"
    with pytest.raises(PlanValidationError, match=r"plan: table 'b': .*data_parallel table has compute_kernel "
                                                  r"'fused'.*use compute_kernel=\"dense\""):
        plan_from_json(json.dumps(data))
