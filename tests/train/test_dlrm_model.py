"""DLRM: the interaction against a hand loop, the whole model against TorchRec's DLRM with the same weights."""

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.train.model import DLRM, InteractionArch

TABLES = [
    rtk.EmbeddingBagConfig(name="t0", num_embeddings=20, embedding_dim=4, feature_names=["f0", "f1"]),
    rtk.EmbeddingBagConfig(name="t1", num_embeddings=9, embedding_dim=4, feature_names=["f2"]),
]


def kjt_values():
    keys = ["f0", "f1", "f2"]
    lengths = torch.tensor([1, 2, 0, 3, 1, 1])  # batch 2
    values = torch.tensor([3, 4, 19, 0, 1, 2, 8, 5])
    return keys, values, lengths


def test_interaction_is_every_pairwise_dot_after_the_dense_vector():
    torch.manual_seed(0)
    dense, sparse = torch.randn(2, 4), torch.randn(2, 3, 4)
    out = InteractionArch(3)(dense, sparse)
    for b in range(2):
        vectors = [dense[b]] + [sparse[b, f] for f in range(3)]
        pairs = [torch.dot(vectors[i], vectors[j]) for i in range(4) for j in range(i + 1, 4)]
        torch.testing.assert_close(out[b], torch.cat([dense[b], torch.stack(pairs)]))


def test_needs_matching_dims():
    ebc = rtk.EmbeddingBagCollection(TABLES)
    with pytest.raises(ValueError, match="must equal the tables' embedding_dim=4"):
        DLRM(ebc, 3, [8, 5], [4, 1])
    mixed = [TABLES[0], rtk.EmbeddingBagConfig(name="t9", num_embeddings=3, embedding_dim=8, feature_names=["g"])]
    with pytest.raises(ValueError, match="same embedding_dim"):
        DLRM(rtk.EmbeddingBagCollection(mixed), 3, [8, 4], [4, 1])


@pytest.mark.torchrec
def test_matches_torchrec_dlrm_with_the_same_weights():
    torchrec = pytest.importorskip("torchrec")
    from torchrec.models.dlrm import DLRM as TorchRecDLRM

    torch.manual_seed(0)
    ours = DLRM(rtk.EmbeddingBagCollection(TABLES), 3, [8, 4], [16, 8, 1])
    tr_tables = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings,
                                             embedding_dim=t.embedding_dim, feature_names=t.feature_names)
                 for t in TABLES]
    theirs = TorchRecDLRM(torchrec.EmbeddingBagCollection(tr_tables), 3, [8, 4], [16, 8, 1])
    ours_params = dict(ours.named_parameters())
    with torch.no_grad():
        for arch in ("dense_arch", "over_arch"):
            mine = [p for n, p in ours.named_parameters() if n.startswith(arch)]
            other = [p for n, p in theirs.named_parameters() if n.startswith(arch)]
            assert [p.shape for p in mine] == [p.shape for p in other]
            for a, b in zip(mine, other):
                b.copy_(a)
        for table in TABLES:
            theirs.sparse_arch.embedding_bag_collection.embedding_bags[table.name].weight.copy_(
                ours_params[f"sparse_arch.embedding_bag_collection.embedding_bags.{table.name}.weight"])
    keys, values, lengths = kjt_values()
    dense = torch.randn(2, 3)
    expected = theirs(dense, torchrec.KeyedJaggedTensor.from_lengths_sync(keys, values, lengths))
    actual = ours(dense, rtk.KeyedJaggedTensor.from_lengths_sync(keys, values, lengths))
    torch.testing.assert_close(actual, expected)
