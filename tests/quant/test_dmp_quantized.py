"""DistributedModelParallel over a quantized model, as TorchRec's inference example builds it: quantize_embeddings,
plan with the QuantEmbeddingBagCollectionSharder, then DMP(module, env, plan, sharders=[that sharder],
init_data_parallel=False). The sharded model's predictions equal the unsharded quantized model's, on one rank and
on TorchRec's ShardingEnv(W, 0) of one process (the ranks held here)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
from rectoolkit.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from rectoolkit.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder
from rectoolkit.inference.modules import quantize_embeddings
from rectoolkit.models.dlrm import DLRM

KEYS = ["f0", "f1", "f2"]


def _model(device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables=[
        rtk.EmbeddingBagConfig(name=f"t_{key}", embedding_dim=4, num_embeddings=20 + i, feature_names=[key])
        for i, key in enumerate(KEYS)], device=torch.device(device))
    return DLRM(embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[8, 4],
                over_arch_layer_sizes=[4, 1], dense_device=torch.device("cpu"))


def _inputs():
    kjt = rtk.KeyedJaggedTensor(keys=KEYS, lengths=torch.tensor([1, 2, 0, 1, 1, 1]),
                                values=torch.tensor([1, 2, 3, 4, 5, 6]))
    return torch.arange(8.0).view(2, 4) / 8, kjt


@pytest.mark.parametrize("world_size,sharding_type", [(1, "table_wise"), (2, "table_wise"), (2, "row_wise")])
def test_dmp_shards_a_quantized_model_with_the_unsharded_predictions(world_size, sharding_type):
    model = quantize_embeddings(_model(), dtype=torch.qint8, inplace=True)
    expected = model(*_inputs())
    constraints = {f"t_{key}": ParameterConstraints(sharding_types=[sharding_type], compute_kernels=["quant"])
                   for key in KEYS}
    sharders = [QuantEmbeddingBagCollectionSharder()]
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu",
                                                      local_world_size=world_size),
                                    constraints=constraints).plan(model, sharders)
    env = ShardingEnv.from_local(1, 0) if world_size == 1 else ShardingEnv(world_size, 0)
    dmp = DistributedModelParallel(module=model, device=torch.device("cpu"), env=env, plan=plan, sharders=sharders,
                                   init_data_parallel=False)
    sharded = dmp.module.sparse_arch.embedding_bag_collection
    assert type(sharded).__name__ == ("ShardedQuantEmbeddingBagCollection" if world_size == 1
                                      else "OneProcessShardedQuantEmbeddingBagCollection")
    assert plan.get_plan_for_module("sparse_arch.embedding_bag_collection")["t_f0"].sharding_type == sharding_type
    torch.testing.assert_close(dmp(*_inputs()), expected)


def test_a_quantized_model_on_meta_and_one_without_its_sharder_are_refused_by_name():
    sharders = [QuantEmbeddingBagCollectionSharder()]
    on_meta = quantize_embeddings(_model("meta"), dtype=torch.qint8, inplace=True)
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(on_meta, sharders)
    with pytest.raises(ValueError, match=r"stored rows \['embedding_bags.t_f0.weight'.*are on the meta device"):
        DistributedModelParallel(module=on_meta, env=ShardingEnv.from_local(1, 0), plan=plan, sharders=sharders,
                                 init_data_parallel=False)
    quantized = quantize_embeddings(_model(), dtype=torch.qint8, inplace=True)
    with pytest.raises(ValueError, match="nor a module of a type one of `sharders` shards"):
        DistributedModelParallel(module=quantized, env=ShardingEnv.from_local(1, 0), init_data_parallel=False)
