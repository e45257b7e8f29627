"""Worker of the sharded-inference test (imported by spawned processes; no test functions here)."""

from __future__ import annotations

import json

import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv
from rectoolkit.quant import QuantEmbeddingBagCollection
from rectoolkit.quant.rowwise import dequantize_rowwise
from rectoolkit.quant.sharding import shard_quant_embedding_bag_collection

BATCH = 4
ROWS = {"t_tw": 40, "t_rw": 50, "t_cw": 30, "t_mean": 20}
# issue 12: one collection mixing storage types, each table its own (the rest: INT8)
MIXED_BAGS = {"t_tw": torch.float16, "t_rw": torch.quint4x2, "t_cw": torch.quint2x4, "t_mean": torch.float32}
MIXED_SEQUENCES = {"t_tw": torch.float32, "t_rw": torch.quint2x4, "t_cw": torch.quint4x2}


def quantize(quant_type, float_module, dtype, mixed):
    """`float_module` quantized to `dtype`, or with each table its own type from `mixed` when dtype is "mixed"."""
    if dtype == "mixed":
        return quant_type.from_float(float_module, dtype=torch.int8, per_table_weight_dtype=mixed, backend="torch")
    return quant_type.from_float(float_module, dtype=dtype, backend="torch")


def tables():
    return [rtk.EmbeddingBagConfig(name="t_tw", num_embeddings=40, embedding_dim=16, feature_names=["a"]),
            rtk.EmbeddingBagConfig(name="t_rw", num_embeddings=50, embedding_dim=16, feature_names=["b", "c"]),
            rtk.EmbeddingBagConfig(name="t_cw", num_embeddings=30, embedding_dim=32, feature_names=["d"]),
            rtk.EmbeddingBagConfig(name="t_mean", num_embeddings=20, embedding_dim=8, feature_names=["e"],
                                   pooling=rtk.PoolingType.MEAN)]


def plan(world_size: int):
    on = rtk.ShardMetadata.on_rank
    half = 25
    return {
        "t_tw": rtk.ParameterSharding("table_wise", ranks=[1], shards=[on(1, 0, 0, 40, 16)]),
        "t_rw": rtk.ParameterSharding("row_wise", ranks=[0, 1], shards=[on(0, 0, 0, half, 16), on(1, half, 0, 25, 16)]),
        "t_cw": rtk.ParameterSharding("column_wise", ranks=[0, 1], shards=[on(0, 0, 0, 30, 16), on(1, 0, 16, 30, 16)]),
        "t_mean": rtk.ParameterSharding("table_wise", ranks=[0], shards=[on(0, 0, 0, 20, 8)]),
    }


def batch(rank: int, weighted: bool):
    g = torch.Generator().manual_seed(100 + rank)
    keys = ["a", "b", "c", "d", "e"]
    rows = {"a": 40, "b": 50, "c": 50, "d": 30, "e": 20}
    lengths = torch.randint(0, 4, (len(keys) * BATCH,), generator=g)
    values = torch.cat([torch.randint(0, rows[k], (int(n),), generator=g)
                        for k, chunk in zip(keys, lengths.view(len(keys), BATCH)) for n in [chunk.sum()]])
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    return rtk.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


def sharded_inference_worker(rank: int, world_size: int, result_file: str) -> None:
    results = []
    env = ShardingEnv.from_process_group()
    for dtype in (torch.int8, torch.quint4x2, "mixed"):
        for weighted in (False, True):
            torch.manual_seed(0)
            ebc = rtk.EmbeddingBagCollection(tables(), is_weighted=weighted)
            qebc = quantize(QuantEmbeddingBagCollection, ebc, dtype, MIXED_BAGS)
            # the expected answer: a float collection holding the dequantized tables (column-wise shards keep
            # each row's scale and bias, so they dequantize to the very columns of the whole rows)
            deq = {t.name: dequantize_rowwise(qebc.embedding_bags[t.name].weight, t.data_type, t.embedding_dim)
                   for t in qebc.embedding_bag_configs()}
            expected_module = rtk.EmbeddingBagCollection(tables(), is_weighted=weighted)
            expected_module.load_state_dict({f"embedding_bags.{k}.weight": v for k, v in deq.items()})
            sharded = shard_quant_embedding_bag_collection(qebc, plan(world_size), env)
            local = sharded(batch(rank, weighted)).values()
            mine = expected_module(batch(rank, weighted)).values()
            unsharded = qebc(batch(rank, weighted)).values()
            results.append({"rank": rank, "dtype": str(dtype), "weighted": weighted,
                            "max_diff": float((local - mine).detach().abs().max()),
                            "max_diff_vs_unsharded": float((local - unsharded).detach().abs().max()),
                            "quantized_bytes": sharded.quantized_bytes})
    with open(f"{result_file}.{rank}", "w") as f:
        json.dump(results, f)


# ------------------------------------------------------------------------------------------------ sequences, fx
SEQUENCE_ROWS = {"a": 40, "b": 50, "c": 50, "d": 30}


def sequence_tables():
    return [rtk.EmbeddingConfig(name="t_tw", num_embeddings=40, embedding_dim=16, feature_names=["a"]),
            rtk.EmbeddingConfig(name="t_rw", num_embeddings=50, embedding_dim=16, feature_names=["b", "c"]),
            rtk.EmbeddingConfig(name="t_cw", num_embeddings=30, embedding_dim=16, feature_names=["d"])]


def sequence_plan():
    on = rtk.ShardMetadata.on_rank
    return {
        "t_tw": rtk.ParameterSharding("table_wise", ranks=[1], shards=[on(1, 0, 0, 40, 16)]),
        "t_rw": rtk.ParameterSharding("row_wise", ranks=[0, 1], shards=[on(0, 0, 0, 25, 16), on(1, 25, 0, 25, 16)]),
        "t_cw": rtk.ParameterSharding("column_wise", ranks=[1, 0], shards=[on(1, 0, 0, 30, 8), on(0, 0, 8, 30, 8)]),
    }


def sequence_batch(rank: int):
    g = torch.Generator().manual_seed(200 + rank)
    keys = list(SEQUENCE_ROWS)
    lengths = torch.randint(0, 4, (len(keys) * BATCH,), generator=g)
    values = torch.cat([torch.randint(0, SEQUENCE_ROWS[k], (int(n),), generator=g)
                        for k, chunk in zip(keys, lengths.view(len(keys), BATCH)) for n in [chunk.sum()]])
    return rtk.KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


class Ranker(torch.nn.Module):
    """A model holding a quantized bag collection and a quantized sequence collection (sharded by the test)."""

    def __init__(self, bags, sequences) -> None:
        super().__init__()
        self.bags = bags
        self.sequences = sequences

    def forward(self, bag_features, sequence_features):
        pooled = self.bags(bag_features).values()
        rows = self.sequences(sequence_features)
        return pooled.sum(1), rows["d"].values() * 2 + 1


def sharded_quant_ec_worker(rank: int, world_size: int, result_file: str) -> None:
    """Sharded quantized EC (table-, row-, column-wise) vs the unsharded one and vs the stored rows dequantized;
    then a model holding a sharded quantized EBC and EC, traced by rectoolkit.fx."""
    from rectoolkit.distributed.shard import shard_modules
    from rectoolkit.fx import symbolic_trace
    from rectoolkit.quant import QuantEmbeddingCollection
    from rectoolkit.quant.sharding import shard_quant_embedding_collection

    env = ShardingEnv.from_process_group()
    results = []
    for dtype in (torch.int8, torch.quint4x2, torch.float16, "mixed"):
        torch.manual_seed(0)
        qec = quantize(QuantEmbeddingCollection, rtk.EmbeddingCollection(sequence_tables()), dtype, MIXED_SEQUENCES)
        kjt = sequence_batch(rank)
        sharded = shard_quant_embedding_collection(qec, sequence_plan(), env)
        out, unsharded = sharded(kjt), qec(kjt)
        table_of = {f: t for t in qec.embedding_configs() for f in t.feature_names}
        reference = {f: dequantize_rowwise(qec.embeddings[t.name].weight, t.data_type, 16)[kjt[f].values()]
                     for f, t in table_of.items()}  # the stored rows of each id, dequantized
        results.append({"rank": rank, "what": str(dtype), "keys": sorted(out),
                        "equal_unsharded": all(torch.equal(out[f].values(), unsharded[f].values())
                                               and torch.equal(out[f].lengths(), unsharded[f].lengths())
                                               for f in table_of),
                        "equal_reference": all(torch.equal(out[f].values(), reference[f]) for f in table_of),
                        "quantized_bytes": sharded.quantized_bytes})
    torch.manual_seed(0)
    bags = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(tables()), dtype=torch.int8,
                                                  backend="torch")
    sequences = QuantEmbeddingCollection.from_float(rtk.EmbeddingCollection(sequence_tables()), dtype=torch.int8,
                                                    backend="torch")
    model = Ranker(bags, sequences)
    inputs = (batch(rank, False), sequence_batch(rank))
    expected = model(*inputs)
    shard_modules(model, env=env, plan=rtk.ShardingPlan({"bags": plan(world_size), "sequences": sequence_plan()}))
    traced = symbolic_trace(model)
    pooled, rows = traced(*inputs)
    results.append({"rank": rank, "what": "fx",
                    "leaves": sorted(n.target for n in traced.graph.nodes if n.op == "call_module"),
                    "sharded_types": [type(model.bags).__name__, type(model.sequences).__name__],
                    "pooled_diff": float((pooled - expected[0]).abs().max()), "rows_equal": torch.equal(rows, expected[1])})
    with open(f"{result_file}.{rank}", "w") as f:
        json.dump(results, f)
