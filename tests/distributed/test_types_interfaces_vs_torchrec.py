"""TorchRec's interfaces and enums at torchrec.distributed.types: the enums and helpers equal TorchRec's, the
sharded collections are ShardedModules, the planner a ShardingPlanner, a plan's entries ModuleShardingPlans, and a
ShardedModule subclass written for TorchRec (create_context / input_dist / compute / output_dist) runs unchanged."""

import pytest
import torch

torchrec = pytest.importorskip("torchrec")

import torchrec.distributed.types as theirs  # noqa: E402

import rectoolkit as rtk  # noqa: E402
import rectoolkit.distributed.types as ours  # noqa: E402
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection  # noqa: E402
from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402

ENUMS = ["ParameterStorage", "ComputeDevice", "ComputeKernel", "PipelineType", "ShardingStrategy", "StorageUsageType"]


@pytest.mark.parametrize("name", ENUMS)
def test_enums_have_torchrecs_members(name):
    assert [(m.name, m.value) for m in getattr(ours, name)] == [(m.name, m.value) for m in getattr(theirs, name)]


def test_rank_device_and_tensor_bytes_equal_torchrecs():
    for device_type, rank in [("cpu", 0), ("cpu", 5), ("cuda", 0), ("cuda", 3), ("meta", 2)]:
        assert ours.rank_device(device_type, rank) == theirs.rank_device(device_type, rank)
    for tensor in [torch.zeros(3, 5), torch.zeros(7, dtype=torch.float16), torch.zeros(2, 2, dtype=torch.int64),
                   torch.zeros(0, 4, dtype=torch.uint8)]:
        assert ours.get_tensor_size_bytes(tensor) == theirs.get_tensor_size_bytes(tensor)


def test_null_contexts_behave_as_torchrecs():
    for module in (ours, theirs):
        module.NullShardingContext().record_stream(None)
        with pytest.raises(NotImplementedError):
            module.NullShardedModuleContext().anything = 1


def test_sharded_collections_are_sharded_modules_of_their_unsharded_type():
    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4,
                                                             feature_names=["f"])])
    plan = {"t": rtk.ParameterSharding("table_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 8, 4)])}
    sharded = shard_embedding_bag_collection(ebc, plan, ShardingEnv.local())
    assert isinstance(sharded, ours.ShardedModule) and isinstance(sharded, torch.nn.Module)
    assert not isinstance(ebc, ours.ShardedModule)
    assert sharded.unsharded_module_type() is rtk.EmbeddingBagCollection
    assert list(sharded.sharded_parameter_names("ebc")) == ["ebc.embedding_bags.t.weight"]


def test_the_planner_is_a_sharding_planner_and_plan_entries_module_sharding_plans():
    planner = rtk.EmbeddingShardingPlanner(topology=rtk.Topology(world_size=2, compute_device="cpu"))
    assert isinstance(planner, ours.ShardingPlanner)
    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=8, embedding_dim=4,
                                                             feature_names=["f"])])
    plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    assert all(isinstance(entry, ours.ModuleShardingPlan) for entry in plan.plan.values())
    with pytest.raises(NotImplementedError):
        ours.ModuleShardingPlan()._serialize()
    for module in (ours, theirs):
        class Half(module.ShardingPlanner):  # collective_plan missing: abstract, as TorchRec's
            def plan(self, module, sharders):
                return None
        with pytest.raises(TypeError):
            Half()


def _doubling_module(types):
    """A ShardedModule as a TorchRec user writes one: input_dist returns an awaitable of an awaitable."""

    class Doubling(types.ShardedModule):
        def __init__(self):
            super().__init__()
            self.calls = []

        def create_context(self):
            self.calls.append("create_context")
            return types.NullShardingContext()

        def input_dist(self, ctx, features, scale=1.0):
            self.calls.append("input_dist")
            return types.NoWait(types.NoWait(features * scale))

        def compute(self, ctx, dist_input):
            self.calls.append("compute")
            return dist_input * 2

        def output_dist(self, ctx, output):
            self.calls.append("output_dist")
            return types.LazyNoWait(output + 1)

        def unsharded_module_type(self):
            return torch.nn.Identity

    return Doubling()


def test_a_sharded_module_written_for_torchrec_runs_as_there():
    features = torch.arange(6, dtype=torch.float32)
    mine, reference = _doubling_module(ours), _doubling_module(theirs)
    got, expected = mine(features, scale=3.0), reference(features, scale=3.0)
    assert torch.equal(got.wait() if hasattr(got, "wait") else got, expected.wait())
    assert torch.equal(expected.wait(), features * 3.0 * 2 + 1)
    assert mine.calls == reference.calls == ["create_context", "input_dist", "compute", "output_dist"]
    assert mine.qcomm_codecs_registry == reference.qcomm_codecs_registry == {}
    assert mine.is_pipelined is reference.is_pipelined is False
