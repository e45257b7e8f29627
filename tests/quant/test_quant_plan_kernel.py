"""Plans for quantized collections say compute kernel "quant", as TorchRec 1.8's planner prints them: with the
quantized sharders (ours or TorchRec's), and with no sharders (TorchRec's defaults include the quantized ones)."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.quant import QuantEmbeddingBagCollection
from rectoolkit.quant.sharding import QuantEmbeddingBagCollectionSharder, QuantEmbeddingCollectionSharder
from rectoolkit.quant.shard_modules import shard_modules
from rectoolkit.distributed import ShardingEnv

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

TABLES = [("t", 100, 16), ("u", 40, 8)]
ROW_WISE_ONLY = ["row_wise"]


def _ours():
    float_ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d,
                                                                   feature_names=[n + "_f"]) for n, r, d in TABLES])
    return QuantEmbeddingBagCollection.from_float(float_ebc, dtype=torch.int8)


def _torchrec_plan(world_size):
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder as TorchRecSharder
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as TorchRecQEBC

    qebc = TorchRecQEBC([torchrec.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[n + "_f"],
                                                     data_type=torchrec.DataType.INT8) for n, r, d in TABLES],
                        is_weighted=False, device=torch.device("cpu"))
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world_size, compute_device="cpu"),
                                       constraints={n: ParameterConstraints(sharding_types=ROW_WISE_ONLY)
                                                    for n, _, _ in TABLES})
    return planner.plan(qebc, [TorchRecSharder()])


def _header_block(plan) -> str:
    """The printed plan's first block (param, sharding type, compute kernel, ranks); the shard sizes that follow
    differ: TorchRec sizes the stored int8 rows with their scale and bias, rectoolkit the logical [rows, dim]."""
    return str(plan).split("\n\n")[0]


@pytest.mark.parametrize("world_size", [1, 2])
def test_printed_kernel_is_torchrecs_quant(world_size):
    theirs = _torchrec_plan(world_size)
    from torchrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder as TorchRecSharder

    planner = rtk.EmbeddingShardingPlanner(rtk.Topology(world_size=world_size, compute_device="cpu"), constraints={
        n: rtk.ParameterConstraints(sharding_types=ROW_WISE_ONLY) for n, _, _ in TABLES})
    for sharders in ([QuantEmbeddingBagCollectionSharder()], [TorchRecSharder()], None):
        ours = planner.plan(_ours(), sharders)
        assert {ps.compute_kernel for ps in ours.plan[""].values()} == {"quant"}
        assert _header_block(ours) == _header_block(theirs)
    assert {ps.compute_kernel for ps in theirs.plan[""].values()} == {"quant"}


def test_unconstrained_plans_of_quantized_tables_are_sharded_with_quant():
    """Tiny tables: a float collection's are replicated (data_parallel, "dense"); a quantized collection cannot be
    (its sharders refuse DATA_PARALLEL), so its plan shards them, with kernel "quant", and the plan runs."""
    two_ranks = rtk.EmbeddingShardingPlanner(rtk.Topology(world_size=2, compute_device="cpu"))
    float_ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d,
                                                                   feature_names=[n + "_f"]) for n, r, d in TABLES])
    assert {ps.sharding_type for ps in two_ranks.plan(float_ebc).plan[""].values()} == {"data_parallel"}
    model = torch.nn.ModuleDict({"bags": _ours()})
    bag_types = {t.value for t in QuantEmbeddingBagCollectionSharder()._types}
    for world_size in (2, 1):
        plan = rtk.EmbeddingShardingPlanner(rtk.Topology(world_size=world_size, compute_device="cpu")).plan(model)
        assert all(ps.compute_kernel == "quant" and ps.sharding_type in bag_types for ps in plan.plan["bags"].values())
    ids = rtk.KeyedJaggedTensor.from_lengths_sync(["t_f", "u_f"], torch.tensor([3, 99, 0, 39]), torch.tensor([2, 0, 1, 1]))
    expected = model["bags"](ids).values()
    sharded = shard_modules(model, env=ShardingEnv.local(), plan=plan)
    got = sharded["bags"](ids)
    assert torch.equal((got.wait() if hasattr(got, "wait") else got).values(), expected)
    assert QuantEmbeddingCollectionSharder().compute_kernels("row_wise", "cpu") == ["quant"]
