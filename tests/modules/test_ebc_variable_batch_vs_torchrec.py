"""Differential tests: a KJT with a batch size per feature (VBE) through our EmbeddingBagCollection and TorchRec's."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

BACKENDS = ["torch", pytest.param("fbgemm", marks=[pytest.mark.fbgemm, pytest.mark.skipif(
    not rtk.fbgemm_available(), reason="fbgemm_gpu not available")])]
ROWS = {"user": 10, "item": 20, "seen": 20}


def _tables(lib, pooling):
    cfg = lib.EmbeddingBagConfig
    return [cfg(name="t_user", num_embeddings=10, embedding_dim=4, feature_names=["user"], pooling=lib.PoolingType(pooling)),
            cfg(name="t_item", num_embeddings=20, embedding_dim=8, feature_names=["item", "seen"], pooling=lib.PoolingType(pooling))]


def vbe_inputs(seed, weighted, stride_per_key_per_rank=((2, 1), (3, 2), (6, 6)), batch=12):
    """Keys seen, user, item with their own samples on each of 2 ranks, and inverse indices to a batch of 12."""
    g = torch.Generator().manual_seed(seed)
    keys = ["seen", "user", "item"]
    strides = [sum(row) for row in stride_per_key_per_rank]
    lengths = torch.randint(0, 4, (sum(strides),), generator=g)
    lengths[0] = 0  # an empty bag for sure
    per_key = lengths.split(strides)
    values = torch.cat([torch.randint(0, ROWS[k], (int(per_key[i].sum()),), generator=g) for i, k in enumerate(keys)])
    inverse = torch.stack([torch.randint(0, s, (batch,), generator=g) for s in strides])
    return dict(keys=keys, values=values, lengths=lengths, weights=torch.rand(values.numel(), generator=g) if weighted else None,
                stride_per_key_per_rank=[list(row) for row in stride_per_key_per_rank], inverse_indices=(keys, inverse))


def _pair(pooling, weighted, backend, lr=0.0):
    ours = rtk.EmbeddingBagCollection(_tables(rtk, pooling), is_weighted=weighted, optimizer="sgd", lr=lr, backend=backend)
    theirs = torchrec.EmbeddingBagCollection(tables=_tables(torchrec, pooling), is_weighted=weighted)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pooling,weighted", [("SUM", False), ("MEAN", False), ("SUM", True)])
def test_vbe_ebc_expanded_output_equals_torchrec(backend, pooling, weighted):
    ours, theirs = _pair(pooling, weighted, backend)
    inputs = vbe_inputs(0, weighted)
    a = ours(rtk.KeyedJaggedTensor(**inputs))
    b = theirs(torchrec.KeyedJaggedTensor(**inputs))
    assert a.values().shape == (12, 20)
    assert a.keys() == b.keys() and a.length_per_key() == b.length_per_key()
    torch.testing.assert_close(a.values(), b.values(), rtol=1e-5, atol=1e-6)


def test_vbe_ebc_by_hand():
    """One user pooled once, read by its 3 candidates; 3 items, one each (hand-worked)."""
    tables = [rtk.EmbeddingBagConfig(name="t_user", num_embeddings=4, embedding_dim=1, feature_names=["user"]),
              rtk.EmbeddingBagConfig(name="t_item", num_embeddings=4, embedding_dim=1, feature_names=["item"])]
    ebc = rtk.EmbeddingBagCollection(tables)
    with torch.no_grad():
        ebc.embedding_bags["t_user"].weight.copy_(torch.tensor([[1.0], [10.0], [100.0], [1000.0]]))
        ebc.embedding_bags["t_item"].weight.copy_(torch.tensor([[2.0], [20.0], [200.0], [2000.0]]))
    kjt = rtk.KeyedJaggedTensor(keys=["user", "item"], values=torch.tensor([1, 2, 0, 3, 1]),
                                lengths=torch.tensor([2, 1, 1, 1]), stride_per_key_per_rank=[[1], [3]],
                                inverse_indices=(["user", "item"], torch.tensor([[0, 0, 0], [2, 0, 1]])))
    assert ebc(kjt).values().tolist() == [[110.0, 20.0], [110.0, 2.0], [110.0, 2000.0]]


def test_fixed_batch_with_inverse_indices_is_expanded_as_torchrec():
    ours, theirs = _pair("SUM", False, "torch")
    inputs = vbe_inputs(3, False, stride_per_key_per_rank=((2, 2), (2, 2), (2, 2)), batch=5)
    del inputs["stride_per_key_per_rank"]
    a = ours(rtk.KeyedJaggedTensor(**inputs))
    b = theirs(torchrec.KeyedJaggedTensor(**inputs))
    assert a.values().shape == (5, 20)
    torch.testing.assert_close(a.values(), b.values(), rtol=1e-5, atol=1e-6)


def test_vbe_errors_name_the_features_and_the_fix():
    ours, _ = _pair("SUM", False, "torch")
    inputs = vbe_inputs(4, False)
    del inputs["inverse_indices"]
    with pytest.raises(ValueError, match=r"different batch sizes \{'seen': 3, 'user': 5, 'item': 12\} but .* no "
                                         r"inverse_indices"):
        ours(rtk.KeyedJaggedTensor(**inputs))
    inputs = vbe_inputs(4, False)
    inputs["inverse_indices"] = (["seen", "item"], inputs["inverse_indices"][1][[0, 2]])
    with pytest.raises(ValueError, match=r"inverse_indices have no row for feature\(s\) \['user'\]"):
        ours(rtk.KeyedJaggedTensor(**inputs))
