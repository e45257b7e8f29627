"""Managed collisions without TorchRec: hand-worked evictions, the zero-collision law, state round trips, errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    LFU_EvictionPolicy,
    LRU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor

POLICIES = [LFU_EvictionPolicy, LRU_EvictionPolicy, DistanceLFU_EvictionPolicy]


def _remap(module, ids):
    values = torch.tensor(ids, dtype=torch.int64)
    return module({"t": JaggedTensor(values=values, lengths=torch.tensor([len(ids)]))})["t"].values().tolist()


def test_lfu_hand_worked():
    mch = MCHManagedCollisionModule(zch_size=4, device="cpu", eviction_policy=LFU_EvictionPolicy(), eviction_interval=1)
    # slots empty (count 0), reserved slot 3; newcomers by frequency 5 (x2), 9: they take slots 1, 2 (the first two
    # slots that lose the stable descending ranking [3, new 5, new 9, 0, 1, 2])
    assert _remap(mch, [5, 5, 9]) == [1, 1, 2]
    assert mch.evict().tolist() == [1, 2] and mch.evict() is None
    assert mch.open_slots().tolist() == [1]
    # counts 5:2, 9:1, empty:0; newcomers 7 (x3), 1 (x1): 7 takes the empty row 0; 1 ties with 9, the holder stays
    assert _remap(mch, [7, 7, 7, 1]) == [0, 0, 0, 3]
    assert mch._mch_sorted_raw_ids.tolist()[:3] == [5, 7, 9] and mch._mch_counts.tolist()[:3] == [2, 3, 1]
    assert mch.evict().tolist() == [0] and mch.open_slots().tolist() == [0]
    # 9 counts on (2) but 1 (x3) beats it and takes its row 2; 5 (2) ties with 9 and keeps the earlier slot
    assert _remap(mch, [1, 1, 1, 9]) == [2, 2, 2, 3]
    assert mch._current_iter_tensor.tolist() == [3]


def test_lru_hand_worked_and_eval_only_remaps():
    mch = MCHManagedCollisionModule(zch_size=3, device="cpu", eviction_policy=LRU_EvictionPolicy(), eviction_interval=1)
    assert _remap(mch, [4, 8]) == [0, 1]  # iteration 1: both newcomers beat the never-used slots
    assert mch._mch_last_access_iter.tolist() == [1, 1, 1]
    # iteration 2: 9 is newer than 4 and 8 (tied at 1): the tie keeps the first slot (4), 8 leaves row 1
    assert _remap(mch, [9]) == [1]
    # not collected in between: both evictions' rows (0, 1 then 1) come back once each
    assert mch.evict().tolist() == [0, 1] and mch.evict() is None
    mch.eval()
    assert _remap(mch, [8, 4, 9, 123]) == [2, 0, 1, 2]
    assert mch._current_iter_tensor.tolist() == [2] and mch.evict() is None


def test_eviction_waits_for_the_interval_and_collects_every_batch():
    mch = MCHManagedCollisionModule(zch_size=4, device="cpu", eviction_policy=LFU_EvictionPolicy(), eviction_interval=2)
    assert _remap(mch, [3, 3]) == [3, 3]  # recorded, no slot yet: the reserved row
    assert mch.evict() is None
    # second batch: the history [3, 3, 6, 7, 7, 7] is counted: 7 (x3) first, then 3 (x2), then 6
    assert _remap(mch, [6, 7, 7, 7]) == [2, 0, 0, 0]
    assert _remap(mch, [3]) == [1]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_ids_that_fit_are_never_aliased(data):
    """While at most zch_size - 1 distinct ids were seen, each id owns one row, distinct and stable."""
    zch_size = data.draw(st.integers(2, 12), label="zch_size")
    policy = data.draw(st.sampled_from(POLICIES), label="policy")
    pool = data.draw(st.lists(st.integers(0, 2**62), min_size=1, max_size=zch_size - 1, unique=True), label="ids")
    batches = data.draw(st.lists(st.lists(st.sampled_from(pool), max_size=8), min_size=1, max_size=6),
                        label="batches")
    mch = MCHManagedCollisionModule(zch_size=zch_size, device="cpu", eviction_policy=policy(), eviction_interval=1)
    row_of = {}
    for batch in batches:
        for raw_id, row in zip(batch, _remap(mch, batch)):
            assert row_of.setdefault(raw_id, row) == row, f"id {raw_id} moved from row {row_of[raw_id]} to {row}"
            assert 0 <= row < zch_size - 1
    assert len(set(row_of.values())) == len(row_of)


def test_state_dict_round_trip_continues_identically():
    def run(module, batches):
        return [_remap(module, b) for b in batches]

    first, later = [[1, 2, 2, 3], [4, 4, 5]], [[6, 6, 1], [7, 8, 9, 9], [2, 10]]
    make = lambda: MCHManagedCollisionModule(zch_size=5, device="cpu",  # noqa: E731
                                             eviction_policy=DistanceLFU_EvictionPolicy(), eviction_interval=1)
    original = make()
    run(original, first)
    restored = make()
    restored.load_state_dict(original.state_dict())
    assert run(restored, later) == run(original, later)
    assert sorted(original.state_dict()) == ["_current_iter_tensor", "_mch_counts", "_mch_last_access_iter",
                                             "_mch_remapped_ids_mapping", "_mch_sorted_raw_ids",
                                             "_output_segments_tensor"]


def test_collection_remaps_per_table_in_config_order():
    tables = [EmbeddingBagConfig(name="users", num_embeddings=4, embedding_dim=2, feature_names=["user", "friend"]),
              EmbeddingBagConfig(name="catalog", num_embeddings=3, embedding_dim=2, feature_names=["item"])]
    modules = {name: MCHManagedCollisionModule(size, "cpu", LFU_EvictionPolicy(), 1)
               for name, size in (("catalog", 3), ("users", 4))}
    mcc = ManagedCollisionCollection(modules, tables)
    kjt = KeyedJaggedTensor.from_lengths_sync(["item", "friend", "user"], torch.tensor([500, 77, 77, 88, 9]),
                                              torch.tensor([1, 0, 1, 1, 1, 1]))
    out = mcc(kjt)
    assert out.keys() == ["user", "friend", "item"]
    # users sees [88, 9, 77, 77] (user then friend): by frequency 77, then 9 and 88 (sorted); catalog sees 500
    assert out.lengths().tolist() == [1, 1, 1, 1, 1, 0]
    assert out.values().tolist() == [2, 1, 0, 0, 1]  # catalog: 500 takes slot 1, the first that loses
    assert {table: slots.tolist() for table, slots in mcc.open_slots().items()} == {"users": [0], "catalog": [1]}


def test_errors_name_the_table_and_numbers():
    tables = [EmbeddingBagConfig(name="t", num_embeddings=100, embedding_dim=2, feature_names=["f"])]
    with pytest.raises(ValueError, match=r"table 't' has num_embeddings=100, too small for .*zch_size=200"):
        ManagedCollisionCollection({"t": MCHManagedCollisionModule(200, "cpu", LFU_EvictionPolicy(), 1)}, tables)
    with pytest.raises(ValueError, match=r"table 't' has no managed collision module"):
        ManagedCollisionCollection({}, tables)
    with pytest.raises(ValueError, match=r"zch_size=0; it must be > 0"):
        MCHManagedCollisionModule(0, "cpu", LFU_EvictionPolicy(), 1)
    with pytest.raises(ValueError, match=r"mch_size"):
        MCHManagedCollisionModule(4, "cpu", LFU_EvictionPolicy(), 1, mch_size=2)
    mch = MCHManagedCollisionModule(4, "cpu", LRU_EvictionPolicy(), 1, input_hash_size=1000, name="t")
    with pytest.raises(ValueError, match=r"'t': feature 't' has id 1000 outside \[0, input_hash_size=1000\)"):
        _remap(mch, [3, 1000])
    hashed = MCHManagedCollisionModule(4, "cpu", LRU_EvictionPolicy(), 1, input_hash_size=1000,
                                       input_hash_func=lambda ids, size: ids % size)
    assert _remap(hashed, [3, 1003]) == [2, 2]  # both hash to 3
    mcc = ManagedCollisionCollection({"t": MCHManagedCollisionModule(100, "cpu", LFU_EvictionPolicy(), 1)}, tables)
    with pytest.raises(ValueError, match=r"features \['f'\] of tables \['t'\] are not in the input"):
        mcc(KeyedJaggedTensor.from_lengths_sync(["g"], torch.tensor([1]), torch.tensor([1])))
    shard = MCHManagedCollisionModule(4, "cpu", LFU_EvictionPolicy(), 1).rebuild_with_output_id_range((4, 8), [0, 4, 8])
    assert shard._mch_remapped_ids_mapping.tolist() == [4, 5, 6, 7] and shard.buckets() == 2
    with pytest.raises(ValueError, match=r"rows \[4, 8\) cannot be built out of the loaded output segments \[0, 4\]"):
        shard.load_state_dict(MCHManagedCollisionModule(4, "cpu", LFU_EvictionPolicy(), 1).state_dict())


def test_mc_embedding_bag_collection_looks_up_the_remapped_rows_and_refuses_mismatches():
    from rectoolkit.modules.embedding_modules import EmbeddingBagCollection
    from rectoolkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection

    tables = [EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=3, feature_names=["f"])]
    ebc = EmbeddingBagCollection(tables)
    mcc = ManagedCollisionCollection({"t": MCHManagedCollisionModule(4, "cpu", LFU_EvictionPolicy(), 1)}, tables)
    mc_ebc = ManagedCollisionEmbeddingBagCollection(ebc, mcc)
    weight = ebc.embedding_bags["t"].weight.detach().clone()
    kjt = KeyedJaggedTensor.from_lengths_sync(["f"], torch.tensor([2**40, 2**40, 5, 2**40]), torch.tensor([2, 2]))
    pooled, remapped = mc_ebc(kjt)
    # 2**40 (x3) takes row 1, 5 row 2 (hand-worked as in test_lfu_hand_worked): bags [1, 1] and [2, 1]
    assert remapped is None
    torch.testing.assert_close(pooled["f"], torch.stack([weight[1] + weight[1], weight[2] + weight[1]]))
    other = [EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=8, feature_names=["f"])]
    with pytest.raises(ValueError, match=r"tables \['t'\] and the managed collision collection's \['t'\] must be"):
        ManagedCollisionEmbeddingBagCollection(EmbeddingBagCollection(other), mcc)
    with pytest.raises(NotImplementedError, match="allow_in_place_embed_weight_update=True"):
        ManagedCollisionEmbeddingBagCollection(ebc, mcc, allow_in_place_embed_weight_update=True)
