"""state_dict() of a sharded model needs no other rank, as TorchRec's (each rank's shards as ShardedTensors), so
ported code that saves on rank 0 alone, or edits each rank's local shards as TorchRec's transfer-learning example
does, runs; full_state_dict() gathers whole tables, a collective: what happens when the ranks do not all call it
alike (2 gloo ranks). The ranks meet first (rectoolkit.distributed.state.join_gather): a rank waiting alone warns, a
rank that left ends the wait with an error, and ranks gathering different collections raise before any table moves.
"""

from __future__ import annotations

import os
import sys
import time
import warnings

import pytest
import torch
import torch.distributed as dist

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv, full_state_dict, shard_embedding_bag_collection
from rectoolkit.distributed import state

sys.path.insert(0, os.path.dirname(__file__))
from dist_harness import data_parallel, row_wise, run_workers, table_wise  # noqa: E402


def _tables(prefix: str = "t"):
    return [rtk.EmbeddingBagConfig(name=f"{prefix}{i}", num_embeddings=20 + 5 * i, embedding_dim=4,
                                   feature_names=[f"{prefix}f{i}"]) for i in range(2)]


def _collection(prefix: str = "t"):
    torch.manual_seed(0)  # the same weights on every rank
    return rtk.EmbeddingBagCollection(_tables(prefix))


def _late_worker(rank: int, world_size: int) -> None:
    state.WARN_AFTER_S = 0.2 if rank == 0 else 5.0
    model = _collection()
    expected = {f"embedding_bags.{name}.weight": bag.weight.detach().clone()
                for name, bag in model.embedding_bags.items()}
    plan = rtk.ShardingPlan({"": {"t0": table_wise(1, 20, 4), "t1": row_wise([0, 1], 25, 4)}})
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(), plan=plan)
    if rank == 1:
        time.sleep(3.0)  # rank 0 starts state_dict() alone and waits for this rank
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = full_state_dict(dmp)
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if rank == 0:
        assert len(said) == 1, said
        assert "full_state_dict(DistributedModelParallel) on rank 0 has waited" in said[0], said[0]
        assert "every rank must call it" in said[0] and "model.state_dict()" in said[0], said[0]
    else:
        assert said == [], said  # it came last: nobody to wait for (the gather takes milliseconds, not 5 s)
    assert sorted(got) == sorted(expected)
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key


def test_a_rank_that_calls_full_state_dict_alone_warns_and_still_gets_the_tables_when_the_other_comes():
    run_workers(_late_worker, 2)


def _left_worker(rank: int, world_size: int) -> None:
    sharded = shard_embedding_bag_collection(
        _collection(), {"t0": table_wise(0, 20, 4), "t1": table_wise(1, 25, 4)}, ShardingEnv.from_process_group())
    dist.barrier()  # both have built the collection (and its gather group: leaving sooner breaks that instead)
    if rank == 1:  # leaves without saving (a script whose rank 0 alone saves, then ends)
        dist.destroy_process_group()
        os._exit(0)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 0: another rank of its group left or failed .*every rank must call"):
        full_state_dict(sharded)
    assert time.monotonic() - started < 30.0  # the closed connection ends it (the group's timeout is 60 s)
    del sharded
    dist.destroy_process_group()
    os._exit(0)


def test_full_state_dict_on_one_rank_after_the_other_left_raises_at_once():
    run_workers(_left_worker, 2)


def _different_worker(rank: int, world_size: int) -> None:
    env = ShardingEnv.from_process_group()
    first = shard_embedding_bag_collection(_collection("a"), {"a0": table_wise(0, 20, 4), "a1": table_wise(1, 25, 4)}, env)
    second = shard_embedding_bag_collection(_collection("b"), {"b0": table_wise(1, 20, 4), "b1": table_wise(0, 25, 4)}, env)
    mine = first if rank == 0 else second
    other = 1 - rank
    with pytest.raises(ValueError, match=rf"on rank {rank}: rank\(s\) \[{other}\] are gathering other tables"):
        full_state_dict(mine)
    # nothing moved and nothing is left half done: both collections still gather when the ranks agree
    assert torch.equal(full_state_dict(first)["embedding_bags.a1.weight"], _collection("a").embedding_bags["a1"].weight)
    assert torch.equal(full_state_dict(second)["embedding_bags.b0.weight"], _collection("b").embedding_bags["b0"].weight)


def test_ranks_saving_different_collections_at_once_raise_before_any_table_moves():
    run_workers(_different_worker, 2)


def _replicated_worker(rank: int, world_size: int) -> None:
    state.WARN_AFTER_S = 0.1
    sharded = shard_embedding_bag_collection(
        _collection(), {"t0": data_parallel(2, 20, 4), "t1": data_parallel(2, 25, 4)}, ShardingEnv.from_process_group())
    if rank == 0:  # every table is on every rank: nothing to gather, so rank 0 alone needs nobody
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = full_state_dict(sharded)
        assert torch.equal(got["embedding_bags.t1.weight"], _collection().embedding_bags["t1"].weight)


def test_a_collection_of_replicas_saves_on_one_rank_without_waiting():
    run_workers(_replicated_worker, 2)


def _alone_worker(rank: int, world_size: int, path: str) -> None:
    state.WARN_AFTER_S = 0.1
    model = _collection()
    plan = rtk.ShardingPlan({"": {"t0": table_wise(1, 20, 4), "t1": row_wise([0, 1], 25, 4)}})
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(), plan=plan)
    if rank == 0:  # TorchRec's retrieval example: rank 0 alone saves while rank 1 waits in a barrier
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no waiting, no warning (torch's pickling of a
            torch.save(dmp.state_dict(), path)            # ShardedTensor warns that it is deprecated: a FutureWarning)
    dist.barrier()
    if rank == 0:  # (torch loads a ShardedTensor on the rank that saved it only)
        saved = torch.load(path, weights_only=False)
        # rank 0's shards: none of t0 (on rank 1), rows 0-12 of t1; the metadata names every rank's
        assert [s.metadata.shard_offsets for s in saved["embedding_bags.t0.weight"].local_shards()] == []
        assert [(s.metadata.shard_offsets, s.metadata.shard_sizes) for s in
                saved["embedding_bags.t1.weight"].local_shards()] == [([0, 0], [13, 4])]
        assert [(s.shard_offsets, s.shard_sizes, s.placement.rank()) for s in
                saved["embedding_bags.t1.weight"].metadata().shards_metadata] == [([0, 0], [13, 4], 0),
                                                                                 ([13, 0], [12, 4], 1)]
        assert torch.equal(saved["embedding_bags.t1.weight"].local_shards()[0].tensor,
                           _collection().embedding_bags["t1"].weight[:13])
    # TorchRec's transfer-learning example: each rank writes pretrained rows into its own local shards, then loads
    pretrained = {f"embedding_bags.t{i}.weight": torch.arange(float((20 + 5 * i) * 4)).view(-1, 4) for i in range(2)}
    mine = dmp.state_dict()
    for key, value in mine.items():
        for shard in value.local_shards():
            rows, columns = shard.metadata.shard_offsets
            height, width = shard.metadata.shard_sizes
            shard.tensor.copy_(pretrained[key][rows:rows + height, columns:columns + width])
    dmp.load_state_dict(mine)
    whole = full_state_dict(dmp)
    assert all(torch.equal(whole[key], tensor) for key, tensor in pretrained.items())


def test_state_dict_needs_no_other_rank_and_its_local_shards_load_back(tmp_path):
    run_workers(_alone_worker, 2, str(tmp_path / "rank0.pt"))


def _subgroup_worker(rank: int, world_size: int, path: str) -> None:
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # (every rank makes every group)
    again = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # other groups of the same ranks
    pair, first_rank = pairs[rank // 2], 2 * (rank // 2)
    first = shard_embedding_bag_collection(_collection("a"), {"a0": table_wise(0, 20, 4), "a1": row_wise([0, 1], 25, 4)},
                                           ShardingEnv.from_process_group(pair))
    second = shard_embedding_bag_collection(_collection("b"), {"b0": table_wise(1, 20, 4), "b1": table_wise(0, 25, 4)},
                                            ShardingEnv.from_process_group(again[rank // 2]))
    assert state.gather_group(first.env) is None  # a group of part of the world gathers without meeting first
    # each rank's shards as a ShardedTensor on the pair, placed by global rank (torch's ShardedTensor names them so)
    a1 = first.state_dict()["embedding_bags.a1.weight"]
    assert state.is_sharded_tensor(a1) and a1._process_group is pair
    assert [(s.shard_offsets, s.shard_sizes, s.placement.rank()) for s in a1.metadata().shards_metadata] == \
        [([0, 0], [13, 4], first_rank), ([13, 0], [12, 4], first_rank + 1)]
    ours = rank - first_rank
    assert [(s.metadata.shard_offsets, s.metadata.placement.rank()) for s in a1.local_shards()] == \
        [([13 * ours, 0], rank)]
    assert torch.equal(a1.local_shards()[0].tensor, _collection("a").embedding_bags["a1"].weight[13 * ours:][:[13, 12][ours]])
    # whole tables gathered within each pair, both pairs at once
    assert torch.equal(full_state_dict(first)["embedding_bags.a1.weight"], _collection("a").embedding_bags["a1"].weight)
    assert torch.equal(full_state_dict(second)["embedding_bags.b0.weight"], _collection("b").embedding_bags["b0"].weight)
    # a DMP on the pair plans on the pair's first rank and shares it; tables made on meta start from their init_fn,
    # replicas broadcast from the pair's first rank: every table is the same on both ranks of the pair
    with torch.device("meta"):
        model = rtk.EmbeddingBagCollection(_tables("c"))
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pair))
    whole = full_state_dict(dmp)
    both = [None, None]
    dist.all_gather_object(both, whole, group=pair)
    assert sorted(whole) == ["embedding_bags.c0.weight", "embedding_bags.c1.weight"]
    for key in whole:
        assert torch.equal(both[0][key], both[1][key]) and bool(both[0][key].abs().sum() > 0), key
    # the fused optimizer's tables are ShardedTensors on the pair too
    for name, param in dmp.fused_optimizer.params.items():
        if state.is_sharded_tensor(param):
            assert param._process_group is pair, name
            assert {s.placement.rank() for s in param.metadata().shards_metadata} <= {first_rank, first_rank + 1}
    # the pair's first rank saves alone (no other rank waits or is waited for); its shards come back
    if rank == first_rank:
        torch.save(first.state_dict(), f"{path}.{rank}")
        from torch.distributed._shard.api import load_with_process_group

        with load_with_process_group(pair):  # (torch loads a ShardedTensor of a group within that group)
            saved = torch.load(f"{path}.{rank}", weights_only=False)["embedding_bags.a1.weight"]
        assert torch.equal(saved.local_shards()[0].tensor, _collection("a").embedding_bags["a1"].weight[:13])
    dist.barrier()


def test_collections_on_groups_of_part_of_the_world_hold_sharded_tensors_placed_by_global_rank(tmp_path):
    run_workers(_subgroup_worker, 4, str(tmp_path / "pair.pt"))
