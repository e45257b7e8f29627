"""Criteo and MovieLens loaders on small files the tests write: against TorchRec 1.8's loaders (same rows, same npy
arrays, same batches per rank) and hand-worked values."""

import math
import random

import numpy as np
import pytest
import torch

from rectoolkit.datasets.criteo import (BinaryCriteoUtils, InMemoryBinaryCriteoIterDataPipe, criteo_kaggle,
                                        criteo_terabyte)
from rectoolkit.datasets.movielens import movielens_20m, movielens_25m


def criteo_line(rng, with_label=True):
    ints = ["" if rng.random() < 0.2 else str(rng.randint(-3, 500)) for _ in range(13)]
    cats = ["" if rng.random() < 0.2 else f"{rng.getrandbits(32):08x}" for _ in range(26)]
    return "\t".join(([str(rng.randint(0, 1))] if with_label else []) + ints + cats)


@pytest.fixture
def criteo_files(tmp_path):
    rng = random.Random(0)
    paths = {}
    for name, rows, with_label in (("day_0", 23, True), ("day_1", 9, True), ("test.txt", 5, False)):
        paths[name] = str(tmp_path / name)
        with open(paths[name], "w") as handle:
            handle.write("\n".join(criteo_line(rng, with_label) for _ in range(rows)) + "\n")
    for day in ("day_0", "day_1"):
        BinaryCriteoUtils.tsv_to_npys(paths[day], *(str(tmp_path / f"{day}_{kind}.npy") for kind in
                                                    ("dense", "sparse", "labels")))
    paths["npy"] = {kind: [str(tmp_path / f"{day}_{kind}.npy") for day in ("day_0", "day_1")]
                    for kind in ("dense", "sparse", "labels")}
    return paths


def test_hand_worked_line(tmp_path):
    path = tmp_path / "day"
    path.write_text("0\t" + "\t".join(["4", "", "-1"] + ["1"] * 10) + "\t" + "\t".join(["0000001f", ""] + ["a"] * 24) + "\n")
    row = next(iter(criteo_terabyte([str(path)])))
    assert (row["label"], row["int_0"], row["int_1"], row["int_2"], row["cat_0"], row["cat_1"]) == (0, 4, 0, -1, "0000001f", "")
    names = [str(tmp_path / f"{kind}.npy") for kind in ("dense", "sparse", "labels")]
    BinaryCriteoUtils.tsv_to_npys(str(path), *names)
    dense, sparse, labels = (np.load(name) for name in names)
    # ints shifted by the minimum (-1) plus 2, then log: 4 -> log 7, missing (0) -> log 3, -1 -> log 2
    assert dense[0, :3].tolist() == pytest.approx([math.log(7), math.log(3), math.log(2)], rel=1e-6)
    assert sparse[0, :3].tolist() == [31, 0, 10] and labels.tolist() == [[0]]
    assert BinaryCriteoUtils.get_shape_from_npy(names[1]) == (1, 26)


@pytest.mark.torchrec
def test_rows_and_npys_match_torchrec(criteo_files, tmp_path):
    from torchrec.datasets import criteo as theirs

    for path in (criteo_files["day_0"], criteo_files["day_1"]):
        assert list(criteo_terabyte([path])) == list(theirs.criteo_terabyte([path]))
    assert list(criteo_kaggle(criteo_files["test.txt"])) == list(theirs.criteo_kaggle(criteo_files["test.txt"]))
    assert "label" not in next(iter(criteo_kaggle(criteo_files["test.txt"])))
    assert list(criteo_kaggle(criteo_files["day_1"], row_mapper=None)) == list(
        theirs.criteo_kaggle(criteo_files["day_1"], row_mapper=None))
    for source, dataset in ((criteo_files["day_0"], "criteo_1tb"), (criteo_files["test.txt"], "criteo_kaggle")):
        ours = [str(tmp_path / f"ours_{kind}.npy") for kind in ("d", "s", "l")]
        reference = [str(tmp_path / f"theirs_{kind}.npy") for kind in ("d", "s", "l")]
        BinaryCriteoUtils.tsv_to_npys(source, *ours, dataset_name=dataset)
        theirs.BinaryCriteoUtils.tsv_to_npys(source, *reference, dataset_name=dataset)
        for mine, their in zip(ours, reference):
            a, b = np.load(mine), np.load(their)
            assert a.dtype == b.dtype and np.array_equal(a, b), (dataset, mine)
    dense = criteo_files["npy"]["dense"][0]
    assert np.array_equal(BinaryCriteoUtils.load_npy_range(dense, 3, 5),
                          theirs.BinaryCriteoUtils.load_npy_range(dense, 3, 5))


def batches_as_lists(datapipe):
    out = []
    for batch in datapipe:
        kjt = batch.sparse_features
        out.append((batch.dense_features.tolist(), batch.labels.tolist(), kjt.keys(), kjt.values().tolist(),
                    kjt.lengths().tolist()))
    return out


@pytest.mark.torchrec
@pytest.mark.parametrize("stage, batch_size, world_size, drop_last, hashes, shuffle", [
    ("train", 4, 1, False, None, False),
    ("train", 4, 2, False, None, False),   # 32 rows: 4 rounds of 2x4, no remainder
    ("train", 5, 2, False, [7] * 26, False),  # remainder 2 spread one per rank
    ("train", 5, 3, True, None, False),
    ("train", 10, 3, False, None, True),   # remainder 2 < 3 ranks: the last full round is folded in
    ("val", 3, 2, False, None, False),
    ("test", 3, 2, False, [100] * 26, False),
])
def test_in_memory_batches_match_torchrec(criteo_files, stage, batch_size, world_size, drop_last, hashes, shuffle):
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe as Theirs

    npy = criteo_files["npy"]
    for rank in range(world_size):
        kwargs = dict(stage=stage, dense_paths=npy["dense"], sparse_paths=npy["sparse"], labels_paths=npy["labels"],
                      batch_size=batch_size, rank=rank, world_size=world_size, drop_last=drop_last,
                      hashes=hashes, shuffle_batches=shuffle, shuffle_training_set_random_seed=3)
        ours_pipe = InMemoryBinaryCriteoIterDataPipe(**kwargs)
        ours = batches_as_lists(ours_pipe)
        theirs_pipe = Theirs(**kwargs)
        theirs = batches_as_lists(theirs_pipe)
        assert ours == theirs and len(ours_pipe) == len(theirs_pipe) == len(ours), (rank, len(ours), len(theirs))
        assert ours, "every rank gets at least one batch here"


def test_in_memory_refusals(criteo_files):
    npy = criteo_files["npy"]
    base = dict(dense_paths=npy["dense"], sparse_paths=npy["sparse"], labels_paths=npy["labels"], batch_size=4,
                rank=0, world_size=1)
    with pytest.raises(NotImplementedError, match="shuffle_training_set"):
        InMemoryBinaryCriteoIterDataPipe("train", shuffle_training_set=True, **base)
    with pytest.raises(ValueError, match="stage='dev'"):
        InMemoryBinaryCriteoIterDataPipe("dev", **base)
    with pytest.raises(NotImplementedError, match="path_manager_key"):
        BinaryCriteoUtils.get_shape_from_npy(npy["dense"][0], path_manager_key="s3")
    with pytest.raises(ValueError, match="start_row"):
        BinaryCriteoUtils.load_npy_range(npy["dense"][0], 40, 1)


@pytest.fixture
def movielens_root(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n"
                                          "1,1029,3.0,1260759179\n7,31,bad,1260759185\n")
    (tmp_path / "movies.csv").write_text('movieId,title,genres\n31,"Dangerous Minds, The (1995)",Drama\n'
                                         "1029,Dumbo (1941),Animation|Children|Drama|Musical\n")
    return str(tmp_path)


def test_movielens_hand_worked(movielens_root):
    rows = list(movielens_25m(movielens_root, include_movies_data=True))
    assert rows[0] == {"userId": 1, "movieId": 31, "rating": 2.5, "timestamp": 1260759144,
                       "title": "Dangerous Minds, The (1995)", "genres": "Drama"}
    assert rows[2]["rating"] == 0.0 and len(rows) == 3  # "bad" does not convert
    assert list(movielens_20m(movielens_root, row_mapper=None))[1] == ["1", "1029", "3.0", "1260759179"]
    with pytest.raises(FileNotFoundError, match="ratings.csv"):
        movielens_20m(movielens_root + "/nowhere")


@pytest.mark.torchrec
@pytest.mark.parametrize("include_movies_data", [False, True])
def test_movielens_matches_torchrec(movielens_root, include_movies_data):
    from torchrec.datasets import movielens as theirs

    for ours_fn, theirs_fn in ((movielens_20m, theirs.movielens_20m), (movielens_25m, theirs.movielens_25m)):
        assert list(ours_fn(movielens_root, include_movies_data=include_movies_data)) == list(
            theirs_fn(movielens_root, include_movies_data=include_movies_data))
    assert isinstance(next(iter(movielens_20m(movielens_root))), dict)
    assert isinstance(movielens_20m(movielens_root), torch.utils.data.IterDataPipe)  # .map, .batch ... as TorchRec
