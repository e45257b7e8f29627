"""Collections built on the meta device run forward as TorchRec's do: outputs of the right shapes on meta, from a
meta KeyedJaggedTensor (whose lengths hold no values: TorchRec's stand-in counts, the values split evenly among
the keys) or from a CPU one. Every expected shape is TorchRec 1.8's, on the same calls."""

from __future__ import annotations

import pytest
import torch

import rectoolkit

torchrec = pytest.importorskip("torchrec")
pytestmark = pytest.mark.torchrec

LIBRARIES = {"ours": rectoolkit, "theirs": torchrec}


def batch(lib, device, weighted=False):
    return lib.KeyedJaggedTensor(keys=["fb", "fa", "fc"], values=torch.tensor([1, 2, 3, 4, 5, 6, 7], device=device),
                                 lengths=torch.tensor([1, 2, 0, 2, 1, 1], device=device),
                                 weights=torch.ones(7, device=device) if weighted else None)


def bag_tables(lib, weighted):
    """Two row widths (two groups in the kernel); mean pooling where TorchRec allows it (unweighted bags)."""
    return [lib.EmbeddingBagConfig(name="a", num_embeddings=10, embedding_dim=8, feature_names=["fa", "fb"]),
            lib.EmbeddingBagConfig(name="c", num_embeddings=10, embedding_dim=4, feature_names=["fc"],
                                   pooling=lib.PoolingType.SUM if weighted else lib.PoolingType.MEAN)]


def described(output):
    """(keys, shape, device) of a KeyedTensor, or {name: (values shape, lengths shape, device)} of a dict."""
    if isinstance(output, dict):
        return {k: (tuple(jt.values().shape), tuple(jt.lengths().shape), jt.values().device.type)
                for k, jt in output.items()}
    return list(output.keys()), tuple(output.values().shape), output.values().device.type


@pytest.mark.parametrize("kjt_device", ["meta", "cpu"])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_meta_bag_collection_pools_to_torchrecs_shapes(kjt_device, weighted):
    out = {name: described(lib.EmbeddingBagCollection(tables=bag_tables(lib, weighted), is_weighted=weighted,
                                                      device=torch.device("meta"))(batch(lib, kjt_device, weighted)))
           for name, lib in LIBRARIES.items()}
    assert out["ours"] == out["theirs"] == (["fa", "fb", "fc"], (2, 20), "meta")


@pytest.mark.parametrize("kjt_device", ["meta", "cpu"])
def test_a_meta_sequence_collection_splits_its_rows_as_torchrecs(kjt_device):
    def run(lib):
        tables = [lib.EmbeddingConfig(name=n, num_embeddings=10, embedding_dim=4, feature_names=[f"f{n}"]) for n in "abc"]
        return described(lib.EmbeddingCollection(tables=tables, device=torch.device("meta"))(batch(lib, kjt_device)))

    assert run(rectoolkit) == run(torchrec)
    assert run(rectoolkit)["fb"][0] == (3, 4)  # the real count on CPU; on meta, 7 ids split 3, 2, 2 by key order


def test_meta_kjt_operations_read_torchrecs_stand_in_counts():
    def run(lib):
        kjt = batch(lib, "meta", weighted=True)
        return (kjt.length_per_key(), kjt.offset_per_key(), [(k.keys(), tuple(k.values().shape)) for k in kjt.split([1, 2])],
                kjt.permute([2, 0, 1]).keys(), {k: tuple(v.values().shape) for k, v in kjt.to_dict().items()},
                tuple(kjt["fa"].values().shape), tuple(type(kjt).concat([kjt, kjt]).values().shape))

    assert run(rectoolkit) == run(torchrec)
    assert run(rectoolkit)[0] == [3, 2, 2]


def test_a_dlrm_built_under_the_meta_device_runs_forward():
    def run(lib):
        with torch.device("meta"):
            model = lib.models.dlrm.DLRM(embedding_bag_collection=lib.EmbeddingBagCollection(
                tables=[lib.EmbeddingBagConfig(name=n, num_embeddings=10, embedding_dim=8, feature_names=[f"f{n}"])
                        for n in "abc"]), dense_in_features=3, dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[5, 1])
        logits = model(torch.randn(2, 3, device="meta"), batch(lib, "meta"))
        return tuple(logits.shape), logits.device.type

    import torchrec.models.dlrm  # noqa: F401  (lib.models.dlrm for TorchRec)
    import rectoolkit.models.dlrm  # noqa: F401
    assert run(rectoolkit) == run(torchrec) == ((2, 1), "meta")
