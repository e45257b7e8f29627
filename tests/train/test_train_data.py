"""Synthetic data: deterministic, per-rank slices of one global batch, Zipf skew, pooling factors."""

import pytest
import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.train.data import SyntheticData, zipf_ids
from rectoolkit.workloads import load_workload

TABLES = [
    EmbeddingBagConfig(name="t_big", num_embeddings=50_000, embedding_dim=4, feature_names=["a", "b"]),
    EmbeddingBagConfig(name="t_small", num_embeddings=7, embedding_dim=4, feature_names=["c"]),
]
POOLING = {"a": 1.0, "b": 6.0, "c": 0.5}


def make(rank=0, world_size=1, seed=0, batch_size=64):
    return SyntheticData(TABLES, POOLING, batch_size=batch_size, dense_features=5, zipf_alpha=1.05, seed=seed,
                         rank=rank, world_size=world_size)


def test_shapes_keys_ranges():
    dense, sparse, labels = make().batch(0)
    assert dense.shape == (64, 5) and dense.dtype == torch.float32
    assert sparse.keys() == ["a", "b", "c"] and sparse.stride() == 64
    assert set(labels.unique().tolist()) <= {0.0, 1.0}
    rows = {"a": 50_000, "b": 50_000, "c": 7}
    for key, jagged in sparse.to_dict().items():
        values = jagged.values()
        assert values.dtype == torch.int64
        assert values.numel() == 0 or (values.min() >= 0 and values.max() < rows[key])
        assert int(jagged.lengths().sum()) == values.numel()


def test_deterministic_and_seed_dependent():
    first, again, other_seed = make().batch(3), make().batch(3), make(seed=1).batch(3)
    assert torch.equal(first.dense_features, again.dense_features)
    assert torch.equal(first.sparse_features.values(), again.sparse_features.values())
    assert torch.equal(first.labels, again.labels)
    assert not torch.equal(first.dense_features, other_seed.dense_features)
    assert not torch.equal(first.dense_features, make().batch(4).dense_features)


def test_global_batch_is_the_ranks_batches_in_rank_order():
    ranks = [make(rank=r, world_size=3) for r in range(3)]
    whole = ranks[0].global_batch(5)
    parts = [data.batch(5) for data in ranks]
    assert torch.equal(whole.dense_features, torch.cat([p.dense_features for p in parts]))
    assert torch.equal(whole.labels, torch.cat([p.labels for p in parts]))
    for key in ["a", "b", "c"]:
        assert torch.equal(whole.sparse_features[key].values(), torch.cat([p.sparse_features[key].values() for p in parts]))
        assert torch.equal(whole.sparse_features[key].lengths(), torch.cat([p.sparse_features[key].lengths() for p in parts]))
    assert not torch.equal(parts[0].dense_features, parts[1].dense_features)


def test_pooling_factors_are_the_mean_bag_sizes():
    data = make(batch_size=4000)
    lengths = {key: jt.lengths().double() for key, jt in data.batch(0).sparse_features.to_dict().items()}
    assert torch.all(lengths["a"] == 1)
    assert lengths["b"].mean().item() == pytest.approx(6.0, rel=0.05)
    assert lengths["c"].mean().item() == pytest.approx(0.5, abs=0.03)
    assert set(lengths["c"].unique().tolist()) == {0.0, 1.0}


@pytest.mark.parametrize("alpha", [0.0, 0.8, 1.0, 1.05, 1.5])
def test_zipf_frequencies_follow_the_power_law(alpha):
    rows, samples = 2000, 200_000
    ids = zipf_ids(samples, rows, alpha, torch.Generator().manual_seed(0), salt=5)
    assert ids.min() >= 0 and ids.max() < rows
    observed = torch.bincount(ids, minlength=rows).sort(descending=True).values.double() / samples
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow(-alpha)
    expected = weights / weights.sum()  # exact Zipf, computed here independently
    if alpha == 0:  # uniform: every count within 6 standard deviations of samples / rows
        counts = torch.bincount(ids, minlength=rows).double()
        mean = samples / rows
        assert (counts - mean).abs().max().item() < 6 * mean ** 0.5
        return
    for top in (1, 10, 100):
        assert observed[:top].sum().item() == pytest.approx(expected[:top].sum().item(), rel=0.05, abs=0.004)


def test_hot_ids_are_scattered_over_the_table():
    ids = zipf_ids(50_000, 10_000, 1.05, torch.Generator().manual_seed(0), salt=1)
    top = torch.bincount(ids, minlength=10_000).argsort(descending=True)[:20]
    assert top.max().item() > 1000  # not just rows 0..19


def test_labels_depend_on_the_features():
    # the hidden model's click probability orders the samples: its AUC on the labels is far above 0.5
    from rectoolkit.train.metrics import auc
    data = make(batch_size=20_000)
    dense, sparse, labels = data.batch(0)
    assert 0.2 < labels.mean().item() < 0.8
    # the dense part alone (an independent, partial predictor) already beats chance
    dense_score = dense.double() @ data.dense_weights
    assert auc(dense_score, labels) > 0.55


def test_from_workload_uses_its_tables_and_skew():
    workload = load_workload("dlrm26")
    data = SyntheticData.from_workload(workload, batch_size=8)
    assert data.zipf_alpha == 1.05 and data.dense_features == 13 and len(data.features) == 26
    dense, sparse, labels = data.batch(0)
    assert sparse.stride() == 8 and dense.shape == (8, 13)
