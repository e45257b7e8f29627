"""rectoolkit.datasets.pipes (at torchrec.datasets.utils): splits, Limit, file readers and ParallelReadConcat,
each against TorchRec 1.8's on the same input."""

from __future__ import annotations

import pytest
import torch

from rectoolkit.datasets import criteo_terabyte, movielens_20m
from rectoolkit.datasets.utils import (Limit, LoadFiles, ParallelReadConcat, ReadLinesFromCSV, idx_split_train_val,
                                       rand_split_train_val, train_filter, val_filter)

torchrec_utils = pytest.importorskip("torchrec.datasets.utils")
SAMPLES = list(range(1000))


@pytest.mark.parametrize("train_perc,decimal_places", [(0.7, 2), (0.25, 1), (0.333, 3)])
def test_index_split_is_torchrecs(train_perc, decimal_places):
    ours = idx_split_train_val(SAMPLES, train_perc, decimal_places)
    theirs = torchrec_utils.idx_split_train_val(SAMPLES, train_perc, decimal_places)
    assert [list(p) for p in ours] == [list(p) for p in theirs]
    train, val = (list(p) for p in ours)
    assert sorted(train + val) == SAMPLES and not set(train) & set(val)
    key = idx_split_train_val(SAMPLES, 0.5, 1, key_fn=lambda i: i // 10)  # blocks of ten: keys 0-4 train, 5-9 not
    assert list(key[0])[:52] == list(range(50)) + [100, 101]
    assert train_filter(lambda i: i, 0.7, 2, 69) and val_filter(lambda i: i, 0.7, 2, 70)


@pytest.mark.parametrize("seed", [0, 7])
def test_random_split_is_torchrecs_and_the_same_on_every_pass(seed):
    ours = rand_split_train_val(SAMPLES, 0.8, random_seed=seed)
    theirs = torchrec_utils.rand_split_train_val(SAMPLES, 0.8, random_seed=seed)
    train, val = (list(p) for p in ours)
    assert [train, val] == [list(p) for p in theirs]
    assert list(ours[0]) == train and list(ours[1]) == val  # a second pass draws the same
    assert sorted(train + val) == SAMPLES and 700 < len(train) < 900
    assert train != list(rand_split_train_val(SAMPLES, 0.8, random_seed=seed + 1)[0])


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.5, 1.5, True, "0.5"])
def test_a_train_share_outside_zero_one_is_refused_by_value(bad):
    for split in (idx_split_train_val, rand_split_train_val):
        with pytest.raises(ValueError, match=f"train_perc must be in range \\(0.0, 1.0\\), got {bad!r}"):
            split(SAMPLES, bad)


def test_limit():
    assert list(Limit(SAMPLES, 5)) == list(torchrec_utils.Limit(SAMPLES, 5)) == [0, 1, 2, 3, 4]
    assert list(Limit(SAMPLES[:3], 10)) == [0, 1, 2] and list(Limit(SAMPLES, 0)) == []
    with pytest.raises(ValueError, match="limit must be an int >= 0.*got -1"):
        Limit(SAMPLES, -1)


def test_the_tsv_readers_are_datapipes_that_chain_as_in_torchrec(tmp_path):
    path = tmp_path / "day_0"
    path.write_text("".join(f"{i % 2}\t{i}" + "\t" * 12 + f"\t{i:08x}" + "\t" * 25 + "\n" for i in range(10)))
    batches = list(Limit(criteo_terabyte([str(path)]), 5).batch(2).collate())
    assert [b["int_0"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    train, val = rand_split_train_val(criteo_terabyte([str(path)]), 0.5, random_seed=3)
    theirs = torchrec_utils.rand_split_train_val(criteo_terabyte([str(path)]), 0.5, random_seed=3)
    assert [r["int_0"] for r in train] == [r["int_0"] for r in theirs[0]]
    ratings = tmp_path / "ml"
    ratings.mkdir()
    (ratings / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,2,3.5,100\n4,5,1.0,200\n")
    assert [r["movieId"] for r in movielens_20m(str(ratings)).map(dict)] == [2, 5]


def test_file_readers_yield_each_files_rows(tmp_path):
    files = []
    for i in range(2):
        files.append(str(tmp_path / f"f{i}.csv"))
        (tmp_path / f"f{i}.csv").write_text(f"head\na{i},1\nb{i},2\n")
    rows = list(ReadLinesFromCSV(LoadFiles(files, mode="t"), skip_first_line=True))
    assert rows == [["a0", "1"], ["b0", "2"], ["a1", "1"], ["b1", "2"]]
    assert list(ReadLinesFromCSV(LoadFiles(files[:1], mode="t"), delimiter=";")) == [["head"], ["a0,1"], ["b0,2"]]
    with pytest.raises(ValueError, match="invalid mode 'w'"):
        LoadFiles(files, mode="w")
    with pytest.raises(NotImplementedError, match="path_manager_key='s3'.*local files only"):
        LoadFiles(files, path_manager_key="s3")
    with pytest.raises(TypeError, match="expected a path \\(str\\), got int 3"):
        list(LoadFiles([3]))


def _rows(start: int) -> list:
    return list(range(start, start + 3))


def test_parallel_read_concat_gives_each_worker_its_share_and_every_sample_once():
    pipes = [_rows(10 * i) for i in range(5)]
    assert list(ParallelReadConcat(*pipes)) == sum(pipes, [])  # no workers: all, in order
    loader = torch.utils.data.DataLoader(ParallelReadConcat(*pipes), num_workers=2, batch_size=None)
    got = [int(x) for x in loader]
    assert sorted(got) == sorted(sum(pipes, []))
    # worker 0 takes pipes 0-2, worker 1 pipes 3-4 (TorchRec's split); the loader alternates the workers
    assert got[:2] == [0, 30]
    too_many = torch.utils.data.DataLoader(ParallelReadConcat(*pipes[:1]), num_workers=2, batch_size=None)
    with pytest.raises(ValueError, match="2 DataLoader workers but only 1 datapipes"):
        list(too_many)
