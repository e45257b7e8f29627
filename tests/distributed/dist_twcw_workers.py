"""Worker of the TABLE_COLUMN_WISE differential test: TorchRec 1.8's sharded EmbeddingBagCollection (it runs
TABLE_COLUMN_WISE on CPU) and rectoolkit's, under the same plan, with the same weights and local batches."""

from __future__ import annotations

import json
from typing import List

import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv, shard_embedding_bag_collection
from rectoolkit.plan.torchrec_interop import to_torchrec
from dist_harness import column_wise, load_torchrec_shards, make_batch

TABLES = [("t", 20, 8, ["f", "f2"]), ("u", 12, 8, ["g"])]


def torchrec_and_ours_worker(rank: int, W: int, plans: List[dict], result_file: str) -> None:
    """plans: [(local_world_size, {table: (sharding type, [(rank, columns) per column block]})]; rank 0 writes the
    max differences (TorchRec's sharded output vs ours, ours vs the unsharded bag) on every rank's batch."""
    import torchrec
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv as TorchRecShardingEnv

    results = []
    rows = {name: num_rows for name, num_rows, _, _ in TABLES}
    for local_world_size, blocks in plans:
        plan = {name: column_wise(ranks_and_cols, rows[name], kind=kind) for name, (kind, ranks_and_cols) in blocks.items()}
        torch.manual_seed(0)
        configs = [torchrec.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f)
                   for n, r, d, f in TABLES]
        theirs = torchrec.EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
        weights = {n: theirs.embedding_bags[n].weight.detach().clone() for n, _, _, _ in TABLES}
        dmp = DistributedModelParallel(theirs, env=TorchRecShardingEnv.from_process_group(torch.distributed.group.WORLD),
                                       device=torch.device("cpu"), plan=to_torchrec(rtk.ShardingPlan({"": plan})),
                                       sharders=[EmbeddingBagCollectionSharder()])
        load_torchrec_shards(dmp, weights)  # TorchRec's shards start from their own init: give them the same weights
        ours_module = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d,
                                                                         feature_names=f) for n, r, d, f in TABLES])
        ours_module.load_state_dict({f"embedding_bags.{n}.weight": w for n, w in weights.items()})
        env = ShardingEnv.from_process_group(local_world_size=local_world_size)
        ours = shard_embedding_bag_collection(ours_module, plan, env)
        batch = make_batch({f: r for _, r, _, fs in TABLES for f in fs}, 3 + rank, seed=11 * rank + 1)
        their_batch = torchrec.KeyedJaggedTensor.from_lengths_sync(batch.keys(), batch.values(), batch.lengths())
        their_out = dmp(their_batch).wait().values()
        our_out = ours(batch).values()
        unsharded = ours_module(batch).values()
        results.append({"local_world_size": local_world_size, "rank": rank,
                        "torchrec_vs_ours": float((their_out - our_out).abs().max()),
                        "ours_vs_unsharded": float((our_out - unsharded).abs().max()),
                        "shape": list(our_out.shape)})
    gathered = [None] * W
    torch.distributed.all_gather_object(gathered, results)
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump([r for rank_results in gathered for r in rank_results], f)
