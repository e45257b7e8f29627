"""Worker of the sharded managed-collision test (importable by spawned processes).

A model holding a ManagedCollisionEmbeddingBagCollection (or ...EmbeddingCollection) under DistributedModelParallel on W ranks, both tables
ROW_WISE, against an independent reference on the global batch: per row block k, an unsharded
MCHManagedCollisionModule for rows [start_k, end_k) (`rebuild_with_output_id_range`) fed the ids of input bucket
k (TorchRec's routing: id // ceil(input_hash_size / blocks)), then the unsharded collection (and dense layer)
with the same weights. Compared over training batches with evictions: remapped ids and outputs.
"""

from __future__ import annotations

import tempfile

import torch
from torch import nn

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, save_checkpoint
from rectoolkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection, ManagedCollisionEmbeddingCollection)
from rectoolkit.modules.mc_modules import (
    LFU_EvictionPolicy, LRU_EvictionPolicy, ManagedCollisionCollection, MCHManagedCollisionModule)
from rectoolkit.plan.types import ShardingPlan
from dist_harness import global_batch, make_batch, row_wise

BATCH = 5
# table: (rows, features, raw id range, input_hash_size, hashed, policy, eviction interval)
TABLES = {"users": (8, ["user", "friend"], 5000, 1000, True, LFU_EvictionPolicy, 1),
          "catalog": (6, ["item"], 60, 60, False, LRU_EvictionPolicy, 2)}


def _mch(table: str) -> MCHManagedCollisionModule:
    rows, _, _, input_size, hashed, policy, interval = TABLES[table]
    return MCHManagedCollisionModule(rows, "cpu", policy(), interval, input_hash_size=input_size,
                                     input_hash_func=(lambda ids, size: ids % size) if hashed else None)


class MCModel(nn.Module):
    """pooled: a ManagedCollisionEmbeddingBagCollection and a dense layer; else a ManagedCollisionEmbeddingCollection
    whose sequence embeddings are returned as they are."""

    def __init__(self, pooled: bool) -> None:
        super().__init__()
        config = rtk.EmbeddingBagConfig if pooled else rtk.EmbeddingConfig
        tables = [config(name=t, num_embeddings=rows, embedding_dim=4, feature_names=features)
                  for t, (rows, features, *_rest) in TABLES.items()]
        collection = rtk.EmbeddingBagCollection(tables) if pooled else rtk.EmbeddingCollection(tables)
        wrapper = ManagedCollisionEmbeddingBagCollection if pooled else ManagedCollisionEmbeddingCollection
        self.mc = wrapper(collection, ManagedCollisionCollection({t: _mch(t) for t in TABLES}, tables),
                          return_remapped_features=True)
        self.over = nn.Linear(12, 1) if pooled else None

    def forward(self, kjt):
        embeddings, remapped = self.mc(kjt)
        if self.over is None:
            return {key: jt.values() for key, jt in embeddings.wait().items()}, remapped
        return self.over(embeddings.values()).squeeze(1), remapped


def _reference_remap(blocks, kjt):
    """The global batch's ids remapped by the per-block reference modules (ids hashed by modulo: idempotent)."""
    values = []
    for table, (rows, features, _, input_size, hashed, *_rest) in TABLES.items():
        ids = torch.cat([kjt[f].values() for f in features])
        hashed_ids = ids % input_size if hashed else ids
        bucket = torch.div(hashed_ids, -(-input_size // len(blocks[table])), rounding_mode="floor")
        rows_of_ids = torch.empty_like(ids)
        for k, module in enumerate(blocks[table]):
            mine = bucket == k
            rows_of_ids[mine] = module({table: rtk.JaggedTensor(values=ids[mine], lengths=mine.sum().view(1))}
                                       )[table].values()
        values.append(rows_of_ids)
    keys = [f for _, features, *_rest in TABLES.values() for f in features]
    return rtk.KeyedJaggedTensor(keys=keys, values=torch.cat(values), lengths=torch.cat([kjt[f].lengths() for f in keys]))


def mc_dmp_worker(rank: int, W: int, plan_key: str, pooled: bool) -> None:
    plan = ShardingPlan({plan_key: {t: row_wise(list(range(W)), rows, 4) for t, (rows, *_rest) in TABLES.items()}})
    torch.manual_seed(0)
    reference = MCModel(pooled)
    torch.manual_seed(0)
    dmp = DistributedModelParallel(MCModel(pooled), plan=plan, local_world_size=W)
    blocks = {}
    for table, (rows, *_rest) in TABLES.items():
        shards = sorted(plan.plan[plan_key][table].shards, key=lambda s: s.shard_offsets[0])
        segments = [s.shard_offsets[0] for s in shards] + [rows]
        blocks[table] = [_mch(table).rebuild_with_output_id_range((s.shard_offsets[0], s.shard_offsets[0] +
                                                                   s.shard_sizes[0]), segments) for s in shards]
    ebc = reference.mc._embedding_module
    features = {f: id_range for _, features, id_range, *_rest in TABLES.values() for f in features}
    for step in range(5):
        kjts = [make_batch(features, BATCH, seed=100 * step + r) for r in range(W)]
        out, remapped = dmp(kjts[rank])
        expected_ids = _reference_remap(blocks, global_batch(kjts))
        where = f"rank {rank}, step {step}"
        expected_ids_of, expected_rows_of = expected_ids.to_dict(), ebc(expected_ids)
        for key in remapped.keys():  # this rank's ids come after the lower ranks' ids of the key
            start = sum(int(kjts[r][key].lengths().sum()) for r in range(rank))
            count = int(kjts[rank][key].lengths().sum())
            got = remapped[key].values().tolist()
            want = expected_ids_of[key].values()[start:start + count].tolist()
            assert got == want, f"{where}: feature {key!r} remapped to {got}, expected {want}"
            if not pooled:
                assert torch.allclose(out[key], expected_rows_of[key].values()[start:start + count]), (where, key)
        if pooled:
            expected_out = reference.over(expected_rows_of.values()).squeeze(1)
            assert torch.allclose(out, expected_out[rank * BATCH:(rank + 1) * BATCH], atol=1e-6), where
    assert sum(blocks["users"][k].open_slots().item() for k in range(W)) < 2 * W, "the test should fill the slots"
    if plan_key == "mc":  # without a plan: planned here, the managed-collision tables ROW_WISE
        planned = DistributedModelParallel(MCModel(pooled), local_world_size=W)
        assert {t: ps.sharding_type for t, ps in planned.plan.plan["mc"].items()} == {  # keyed as TorchRec keys it
            "users": "row_wise", "catalog": "row_wise"}, planned.plan
        planned(kjts[rank])
    with tempfile.TemporaryDirectory() as tmp:  # refused before anything is written
        try:
            save_checkpoint(dmp, tmp)
        except Exception as error:  # noqa: BLE001 - every rank raises the agreed error
            assert "managed-collision state sharded per rank" in str(error), error
        else:
            raise AssertionError("a checkpoint of sharded managed-collision state was accepted")
    try:
        DistributedModelParallel(MCModel(pooled), plan=ShardingPlan({plan_key: {
            **plan.plan[plan_key], "catalog": row_wise([0], 6, 4, kind="table_wise")}}), local_world_size=W)
    except NotImplementedError as error:
        assert "table 'catalog' has sharding type 'table_wise'" in str(error), error
    else:
        raise AssertionError("a table-wise managed-collision table was accepted")
