"""Differential tests: our managed-collision modules and TorchRec 1.8's remap the same batches to the same rows,
evict the same rows, and keep the same state_dict (keys and values); each loads the other's state."""

from __future__ import annotations

import pytest
import torch

import rectoolkit.modules.mc_modules as ours
from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.sparse import JaggedTensor, KeyedJaggedTensor

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

from torchrec.modules import mc_modules as theirs  # noqa: E402

POLICIES = ["LFU_EvictionPolicy", "LRU_EvictionPolicy", "DistanceLFU_EvictionPolicy"]


def _batches(seed, count=10, id_range=30, size=12):
    """Fixed-size batches (TorchRec sizes its history buffer from the first batch)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, id_range, (size,), generator=g) ** 3 for _ in range(count)]  # sparse, large ids


def _pair(policy, zch_size=8, interval=1, policy_kwargs=None, **kwargs):
    policy_kwargs = policy_kwargs or {}
    mine = ours.MCHManagedCollisionModule(zch_size, "cpu", getattr(ours, policy)(**policy_kwargs), interval, **kwargs)
    reference = theirs.MCHManagedCollisionModule(zch_size=zch_size, device=torch.device("cpu"),
                                                 eviction_policy=getattr(theirs, policy)(**policy_kwargs),
                                                 eviction_interval=interval, **kwargs)
    return mine, reference


def _assert_same_state(mine, reference):
    mine_state, reference_state = mine.state_dict(), reference.state_dict()
    assert list(mine_state) == list(reference_state)
    for key, value in reference_state.items():
        assert torch.equal(mine_state[key], value), key


def _run_both(mine, reference, batches):
    lengths = torch.tensor([5, 0, 7])
    for step, values in enumerate(batches):
        got = mine({"t": JaggedTensor(values=values, lengths=lengths)})["t"]
        expected = reference({"t": torchrec.JaggedTensor(values=values, lengths=lengths)})["t"]
        assert torch.equal(got.values(), expected.values()), step
        assert torch.equal(got.lengths(), expected.lengths())
        mine_evicted, reference_evicted = mine.evict(), reference.evict()
        assert (mine_evicted is None) == (reference_evicted is None), step
        if reference_evicted is not None:
            assert torch.equal(mine_evicted, reference_evicted), step
        assert torch.equal(mine.open_slots(), reference.open_slots()), step


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("interval", [1, 3])
def test_same_rows_evictions_and_state_over_batches(policy, interval):
    for seed in range(3):
        mine, reference = _pair(policy, interval=interval)
        _run_both(mine, reference, _batches(seed))
        _assert_same_state(mine, reference)
        mine.eval(), reference.eval()
        _run_both(mine, reference, _batches(seed + 100, count=2))


def test_decay_hash_func_offset_and_threshold_filter():
    def keep_above_mean(counts):
        threshold = counts.float().mean()
        return counts > threshold, threshold

    mine, reference = _pair("DistanceLFU_EvictionPolicy", zch_size=6, interval=2,
                            policy_kwargs=dict(decay_exponent=2.0, threshold_filtering_func=keep_above_mean),
                            input_hash_size=50, input_hash_func=lambda ids, size: ids % size,
                            output_global_offset=12, output_segments=[0, 12, 18], buckets=2)
    _run_both(mine, reference, _batches(7))
    _assert_same_state(mine, reference)


def test_each_loads_the_others_state_and_continues_alike():
    mine, reference = _pair("LRU_EvictionPolicy", interval=2)
    _run_both(mine, reference, _batches(1, count=5))
    fresh_mine, fresh_reference = _pair("LRU_EvictionPolicy", interval=2)
    fresh_mine.load_state_dict(reference.state_dict())
    fresh_reference.load_state_dict(mine.state_dict())
    _run_both(fresh_mine, fresh_reference, _batches(2, count=5))
    _assert_same_state(fresh_mine, fresh_reference)


def test_collection_same_as_torchrec():
    def build(lib, cfg):
        tables = [cfg(name="users", num_embeddings=6, embedding_dim=2, feature_names=["user", "friend"]),
                  cfg(name="catalog", num_embeddings=5, embedding_dim=2, feature_names=["item"])]
        # in the configs' order: TorchRec pairs the dict's modules with the tables by position (ours by name)
        modules = {"users": lib.MCHManagedCollisionModule(zch_size=6, device=torch.device("cpu"),
                                                          eviction_policy=lib.LRU_EvictionPolicy(),
                                                          eviction_interval=2),
                   "catalog": lib.MCHManagedCollisionModule(zch_size=5, device=torch.device("cpu"),
                                                            eviction_policy=lib.LFU_EvictionPolicy(),
                                                            eviction_interval=1)}
        return lib.ManagedCollisionCollection(modules, tables)

    mine = build(ours, EmbeddingBagConfig)
    reference = build(theirs, torchrec.EmbeddingBagConfig)
    g = torch.Generator().manual_seed(0)
    keys = ["item", "friend", "user"]
    lengths = torch.tensor([2, 1, 0, 3, 1, 1, 2, 2, 1])  # the same per step: TorchRec's history buffer is sized once
    for step in range(8):
        values = torch.randint(0, 12, (int(lengths.sum()),), generator=g) * 1_000_003
        got = mine(KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
        expected = reference(torchrec.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
        assert got.keys() == expected.keys(), step
        assert torch.equal(got.values(), expected.values()) and torch.equal(got.lengths(), expected.lengths()), step
        mine_evicted, reference_evicted = mine.evict(), reference.evict()
        assert list(mine_evicted) == list(reference_evicted)
        for table, rows in reference_evicted.items():
            assert (rows is None and mine_evicted[table] is None) or torch.equal(mine_evicted[table], rows), table
    assert {t: s.tolist() for t, s in mine.open_slots().items()} == {t: s.tolist()
                                                                      for t, s in reference.open_slots().items()}
    mine_state, reference_state = mine.state_dict(), reference.state_dict()
    assert list(mine_state) == list(reference_state)
    assert all(torch.equal(mine_state[k], v) for k, v in reference_state.items())


@pytest.mark.parametrize("pooled", [True, False])
def test_mc_embedding_collections_same_outputs_and_state_dict_keys(pooled):
    from torchrec.modules import mc_embedding_modules as their_mc_embedding

    import rectoolkit as rtk
    from rectoolkit.modules import mc_embedding_modules as our_mc_embedding

    def build(lib, mc_lib, mc_embedding_lib):
        config = lib.EmbeddingBagConfig if pooled else lib.EmbeddingConfig
        tables = [config(name="users", num_embeddings=6, embedding_dim=4, feature_names=["user", "friend"]),
                  config(name="catalog", num_embeddings=5, embedding_dim=4, feature_names=["item"])]
        collection = (lib.EmbeddingBagCollection if pooled else lib.EmbeddingCollection)(
            tables=tables, device=torch.device("cpu"))
        modules = {t.name: mc_lib.MCHManagedCollisionModule(zch_size=t.num_embeddings, device=torch.device("cpu"),
                                                            eviction_policy=mc_lib.LFU_EvictionPolicy(),
                                                            eviction_interval=2) for t in tables}
        wrapper = (mc_embedding_lib.ManagedCollisionEmbeddingBagCollection if pooled
                   else mc_embedding_lib.ManagedCollisionEmbeddingCollection)
        return wrapper(collection, mc_lib.ManagedCollisionCollection(modules, tables), return_remapped_features=True)

    reference = build(torchrec, theirs, their_mc_embedding)
    mine = build(rtk, ours, our_mc_embedding)
    assert list(mine.state_dict()) == list(reference.state_dict())
    mine.load_state_dict(reference.state_dict())  # the same weights
    g = torch.Generator().manual_seed(3)
    keys = ["friend", "item", "user"]
    lengths = torch.tensor([1, 2, 0, 2, 1, 1, 3, 0, 1])
    for step in range(6):
        values = torch.randint(0, 10, (int(lengths.sum()),), generator=g) * 7919
        got, got_ids = mine(KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
        expected, expected_ids = reference(torchrec.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
        assert torch.equal(got_ids.values(), expected_ids.values()) and got_ids.keys() == expected_ids.keys(), step
        if pooled:
            assert got.keys() == expected.keys()
            torch.testing.assert_close(got.values(), expected.values())
        else:
            assert list(got) == list(expected)
            for key, jagged in expected.items():
                torch.testing.assert_close(got[key].values(), jagged.values())
                assert torch.equal(got[key].lengths(), jagged.lengths())
    mine_state, reference_state = mine.state_dict(), reference.state_dict()
    assert all(torch.equal(mine_state[k], v) for k, v in reference_state.items())


@pytest.mark.parametrize("name,kwargs", [("dynamic_threshold_filter", {"threshold_skew_multiplier": 1.5}),
                                         ("average_threshold_filter", {}),
                                         ("probabilistic_threshold_filter", {"per_id_probability": 0.2})])
def test_threshold_filters_same_as_torchrec(name, kwargs):
    counts = torch.randint(1, 9, (40,), generator=torch.Generator().manual_seed(5))
    torch.manual_seed(11)  # the probabilistic filter draws from torch's global generator
    mine_mask, mine_threshold = getattr(ours, name)(counts, **kwargs)
    torch.manual_seed(11)
    their_mask, their_threshold = getattr(theirs, name)(counts, **kwargs)
    assert torch.equal(mine_mask, their_mask) and torch.equal(torch.as_tensor(mine_threshold),
                                                              torch.as_tensor(their_threshold))
    assert 0 < int(mine_mask.sum()) < len(counts)  # the case filters something and keeps something
