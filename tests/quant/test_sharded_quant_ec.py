"""Sharded quantized EmbeddingCollection in one process (ShardingEnv.local()): every id reads its stored row,
dequantized; the sharder and shard_modules; the combinations it refuses. Two ranks: test_sharded_inference.py."""

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv
from rectoolkit.distributed.shard import shard_modules
from rectoolkit.quant import (
    QuantEmbeddingBagCollection,
    QuantEmbeddingCollection,
    dequantize_rowwise,
    quantize_rowwise,
    slice_columns_rowwise,
)
from rectoolkit.quant.sharding import QuantEmbeddingCollectionSharder, shard_quant_embedding_collection

on = rtk.ShardMetadata.on_rank


def tables():
    return [rtk.EmbeddingConfig(name="t_tw", num_embeddings=12, embedding_dim=8, feature_names=["a"]),
            rtk.EmbeddingConfig(name="t_rw", num_embeddings=10, embedding_dim=8, feature_names=["b", "c"]),
            rtk.EmbeddingConfig(name="t_cw", num_embeddings=9, embedding_dim=8, feature_names=["d"])]


def plan():
    return {"t_tw": rtk.ParameterSharding("table_wise", ranks=[0], shards=[on(0, 0, 0, 12, 8)]),
            "t_rw": rtk.ParameterSharding("row_wise", ranks=[0], shards=[on(0, 0, 0, 10, 8)]),
            "t_cw": rtk.ParameterSharding("column_wise", ranks=[0, 0], shards=[on(0, 0, 0, 9, 4), on(0, 0, 4, 9, 4)])}


def batch():
    return rtk.KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c", "d"], values=torch.tensor([11, 0, 3, 9, 9, 1, 8, 2]),
        lengths=torch.tensor([2, 1, 0, 2, 1, 0, 1, 1]))


def quantized(dtype, **kwargs):
    torch.manual_seed(0)
    return QuantEmbeddingCollection.from_float(rtk.EmbeddingCollection(tables()), dtype=dtype, backend="torch",
                                               **kwargs)


@pytest.mark.parametrize("dtype", [torch.int8, torch.quint4x2, torch.quint2x4, torch.float16, torch.float32])
@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_every_id_reads_its_stored_row(dtype, backend):
    qec = quantized(dtype)
    sharded = shard_quant_embedding_collection(qec, plan(), ShardingEnv.local(), backend=backend)
    out, unsharded, kjt = sharded(batch()), qec(batch()), batch()
    assert list(out) == ["a", "b", "c", "d"]
    for table in qec.embedding_configs():
        rows = dequantize_rowwise(qec.embeddings[table.name].weight, table.data_type, 8, backend="torch")
        for feature in table.feature_names:
            assert torch.equal(out[feature].values(), rows[kjt[feature].values()]), (dtype, feature)
            assert torch.equal(out[feature].values(), unsharded[feature].values())
            assert torch.equal(out[feature].lengths(), kjt[feature].lengths())


def test_memory_and_local_shards_are_the_stored_bytes():
    qec = quantized(torch.int8)
    sharded = shard_quant_embedding_collection(qec, plan(), ShardingEnv.local())
    # int8 rows: 4 bytes scale/bias + 8 codes -> padded to 16; the 4-column blocks: 4 + 4 -> 16 too
    assert sharded.memory_bytes() == {"weights": (12 + 10 + 9 + 9) * 16, "optimizer": 0, "device": 0,
                                      "host": (12 + 10 + 9 + 9) * 16}
    shards = {(table, shard.shard_offsets[1]): rows for table, shard, rows, _ in sharded.local_shards()}
    assert sorted(shards) == [("t_cw", 0), ("t_cw", 4), ("t_rw", 0), ("t_tw", 0)]
    assert torch.equal(shards[("t_tw", 0)], qec.embeddings["t_tw"].weight)
    assert torch.equal(dequantize_rowwise(shards[("t_cw", 4)], rtk.DataType.INT8, 4, backend="torch"),
                       dequantize_rowwise(qec.embeddings["t_cw"].weight, rtk.DataType.INT8, 8, backend="torch")[:, 4:])


def test_need_indices_and_half_output():
    qec = quantized(torch.int8, output_dtype=torch.float16)
    qec._need_indices = True
    sharded = QuantEmbeddingCollectionSharder().shard(qec, plan(), ShardingEnv.local(), module_fqn="seq")
    assert type(sharded).__name__ == "ShardedQuantEmbeddingCollection" and sharded.module_fqn == "seq"
    out, expected = sharded(batch()), qec(batch())
    for feature in ("a", "b", "c", "d"):
        assert out[feature].values().dtype == torch.float16
        assert torch.equal(out[feature].values(), expected[feature].values())
        assert torch.equal(out[feature].weights(), batch()[feature].values().to(out[feature].weights().dtype))


def test_shard_modules_replaces_the_quantized_sequence_collection():
    qec = quantized(torch.int8)
    expected = qec(batch())
    model = torch.nn.ModuleDict({"seq": qec})
    shard_modules(model, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"seq": plan()}))
    assert type(model["seq"]).__name__ == "ShardedQuantEmbeddingCollection"
    out = model["seq"](batch())  # inference: the dict itself, no awaitable
    assert isinstance(out, dict) and all(torch.equal(out[f].values(), expected[f].values()) for f in expected)


def test_column_slices_keep_each_rows_scale_and_bias():
    weight = torch.tensor([[0.0, 1.5, -2.0, 7.0, 3.25, -0.5, 2.0, 1.0]])
    for data_type, cols in ((rtk.DataType.INT8, (3, 7)), (rtk.DataType.INT4, (2, 6)), (rtk.DataType.FP16, (1, 8))):
        rows = quantize_rowwise(weight, data_type, backend="torch")
        whole = dequantize_rowwise(rows, data_type, 8, backend="torch")
        block = slice_columns_rowwise(rows, data_type, 8, *cols)
        assert block.shape[1] % 16 == 0
        assert torch.equal(dequantize_rowwise(block, data_type, cols[1] - cols[0], backend="torch"),
                           whole[:, cols[0]:cols[1]])
    with pytest.raises(ValueError, match=r"column 3 is inside a byte"):
        slice_columns_rowwise(quantize_rowwise(weight, rtk.DataType.INT4, backend="torch"), rtk.DataType.INT4, 8, 3, 7)


@pytest.mark.parametrize("kind, match", [
    ("data_parallel", r"table 't_rw' is planned data_parallel.*give every replica the quantized module"),
    ("table_row_wise", r"table 't_rw' is planned table_row_wise.*plan one of \['table_wise', 'row_wise', 'column_wise'\]"),
])
def test_unsupported_sharding_types_are_refused(kind, match):
    bad = plan()
    bad["t_rw"] = rtk.ParameterSharding(kind, ranks=[0], shards=[on(0, 0, 0, 10, 8)])
    with pytest.raises(ValueError, match=match):
        shard_quant_embedding_collection(quantized(torch.int8), bad, ShardingEnv.local())


def test_column_blocks_inside_a_byte_are_refused():
    bad = plan()
    bad["t_cw"] = rtk.ParameterSharding("column_wise", ranks=[0, 0], shards=[on(0, 0, 0, 9, 3), on(0, 0, 3, 9, 5)])
    with pytest.raises(ValueError, match=r"table 't_cw' \(INT4\) has a column block at columns 0..3"):
        shard_quant_embedding_collection(quantized(torch.quint4x2), bad, ShardingEnv.local())


def test_sharder_refuses_other_modules_and_arguments():
    with pytest.raises(NotImplementedError, match="fused_params"):
        QuantEmbeddingCollectionSharder(fused_params={"learning_rate": 0.1})
    with pytest.raises(TypeError, match="shards QuantEmbeddingCollection"):
        QuantEmbeddingCollectionSharder().shard(rtk.EmbeddingCollection(tables()), plan(), ShardingEnv.local())
    assert QuantEmbeddingCollectionSharder().compute_kernels("table_wise", "cpu") == ["quant"]


class Ranker(torch.nn.Module):
    def __init__(self, bags, sequences) -> None:
        super().__init__()
        self.bags = bags
        self.sequences = sequences

    def forward(self, features):
        rows = self.sequences(features)
        return self.bags(features).values() * 2, rows["d"].values() + 1


def test_fx_traces_a_model_holding_sharded_quantized_collections():
    from rectoolkit.fx import Tracer, symbolic_trace

    torch.manual_seed(0)
    bag_tables = [rtk.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                         feature_names=t.feature_names) for t in tables()]
    bags = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(bag_tables), dtype=torch.int8)
    model = Ranker(bags, quantized(torch.quint4x2))
    expected = model(batch())
    shard_modules(model, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"bags": plan(), "sequences": plan()}))
    for traced in (symbolic_trace(model),
                   torch.fx.GraphModule(model, Tracer(leaf_modules=["IntNBitTableBatchedEmbeddingBagsCodegen"]).trace(model))):
        assert [n.target for n in traced.graph.nodes if n.op == "call_module"] == ["sequences._run_groups",
                                                                                  "bags._run_groups"]
        pooled, rows = traced(batch())
        torch.testing.assert_close(pooled, expected[0], rtol=0, atol=1e-5)
        assert torch.equal(rows, expected[1])


def test_the_planner_takes_the_quantized_sharders():
    """planner.plan(model, [quantized sharders]) as TorchRec code writes it: each collection is planned with the
    types its sharder allows, and the plan shards the model to the unsharded answer."""
    from rectoolkit.distributed.planner import EmbeddingShardingPlanner, Topology
    from rectoolkit.quant.sharding import QuantEmbeddingBagCollectionSharder

    bags = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name=f"b{i}", num_embeddings=40, embedding_dim=8,
                                                              feature_names=[f"bf{i}"]) for i in range(2)])
    model = torch.nn.ModuleDict({"bags": QuantEmbeddingBagCollection.from_float(bags, dtype=torch.int8),
                                 "seq": quantized(torch.int8)})
    sharders = [QuantEmbeddingBagCollectionSharder(), QuantEmbeddingCollectionSharder()]
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(model, sharders)
    sequence_types = set(QuantEmbeddingCollectionSharder().sharding_types("cpu"))
    assert set(plan.plan) == {"bags", "seq"}
    assert all(ps.sharding_type in sequence_types for ps in plan.plan["seq"].values())

    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(model, sharders)
    bag_ids = rtk.KeyedJaggedTensor.from_lengths_sync(["bf0", "bf1"], torch.tensor([3, 39, 0, 7]),
                                                      torch.tensor([1, 1, 1, 1]))
    seq_ids = batch()
    want_bags, want_seq = model["bags"](bag_ids).values(), model["seq"](seq_ids)
    sharded = shard_modules(model, env=ShardingEnv.local(), plan=plan)
    got_bags = sharded["bags"](bag_ids)
    got_bags = got_bags.wait() if hasattr(got_bags, "wait") else got_bags
    got_seq = sharded["seq"](seq_ids)
    assert torch.equal(got_bags.values(), want_bags)
    assert all(torch.equal(got_seq[name].values(), want_seq[name].values()) for name in want_seq)
