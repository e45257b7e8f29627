"""Criteo click logs at TorchRec's path (`torchrec.datasets.criteo`): the TSV readers (`criteo_kaggle`,
`criteo_terabyte`), the TSV -> npy preprocessing (`BinaryCriteoUtils.tsv_to_npys`) and the in-memory batch
reader of the npy files (`InMemoryBinaryCriteoIterDataPipe`), on local files.

A line is: label, 13 integers, 26 categoricals in hex, tab-separated, any of them empty. The TSV readers yield
one dict per line ({"label": int, "int_0": int, ..., "cat_25": str}, a missing value is 0 or ""); the Kaggle
test file has no label column, and the names are given from the right, so its rows have no "label".

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "day_0")
    >>> _ = open(path, "w").write("1\\t5" + "\\t" * 12 + "\\t68fd1e64" + "\\t" * 25 + "\\n")
    >>> row = next(iter(criteo_terabyte([path])))
    >>> row["label"], row["int_0"], row["int_1"], row["cat_0"], row["cat_1"]
    (1, 5, 0, '68fd1e64', '')

The npy form (what DLRM's scripts train on): dense float32 [N, 13] = log(x - min + 2) over the file's
minimum integer, sparse int64 [N, 26] = int(hex, 16) (missing: 0), labels int32 [N, 1]. Batches of the
npy files are `Batch`es whose KJT has one id per feature and sample (keys cat_0..cat_25); ids are taken
modulo `hashes` when given. `rectoolkit.train.CriteoTSV` reads the TSV straight into batches instead.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np
import torch
from torch.utils.data import IterableDataset, IterDataPipe, get_worker_info

from rectoolkit.datasets.utils import Batch, read_csv_rows, safe_cast
from rectoolkit.sparse import KeyedJaggedTensor

FREQUENCY_THRESHOLD = 3
INT_FEATURE_COUNT = 13
CAT_FEATURE_COUNT = 26
DAYS = 24
DEFAULT_LABEL_NAME = "label"
DEFAULT_INT_NAMES: List[str] = [f"int_{i}" for i in range(INT_FEATURE_COUNT)]
DEFAULT_CAT_NAMES: List[str] = [f"cat_{i}" for i in range(CAT_FEATURE_COUNT)]
DEFAULT_COLUMN_NAMES: List[str] = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]
TOTAL_TRAINING_SAMPLES = 4195197692  # rows of days 0-22 of the 1TB logs (day 23: validation and test)
_DEFAULT_PATH_MANAGER = "torchrec"


def _cast(column: str, text: str) -> Union[int, str]:
    return text if column.startswith("cat_") else safe_cast(text, int, 0)


def _default_row_mapper(example: List[str]) -> Dict[str, Union[int, str]]:
    """One split line -> {column name: value}, named from the right (a line without label has no "label")."""
    if len(example) > len(DEFAULT_COLUMN_NAMES):
        raise ValueError(f"Criteo line has {len(example)} tab-separated columns, at most {len(DEFAULT_COLUMN_NAMES)} "
                         f"expected (label, {INT_FEATURE_COUNT} integers, {CAT_FEATURE_COUNT} categoricals)")
    return {name: _cast(name, text) for name, text in zip(reversed(DEFAULT_COLUMN_NAMES), reversed(example))}


def _local_only(what: str, path_manager_key: str) -> None:
    if path_manager_key != _DEFAULT_PATH_MANAGER:
        raise NotImplementedError(f"{what}: path_manager_key={path_manager_key!r} is not implemented; rectoolkit "
                                  "reads local files only (leave the default)")


class CriteoIterDataPipe(IterDataPipe):
    """The lines of Criteo TSV files, each through `row_mapper` (None: the split line as a list of str).
    In a DataLoader with workers, worker k reads files k, k + num_workers, ... (as TorchRec)."""

    def __init__(self, paths: Iterable[str], *, row_mapper: Optional[Callable[[List[str]], Any]] = _default_row_mapper,
                 **open_kw: Any) -> None:
        super().__init__()
        self.paths = list(paths)
        self.row_mapper = row_mapper
        self.open_kw = open_kw

    def __iter__(self) -> Iterator[Any]:
        paths = self.paths
        worker = get_worker_info()
        if worker is not None:
            paths = [path for index, path in enumerate(paths) if index % worker.num_workers == worker.id]
        for row in read_csv_rows(paths, delimiter="\t", **self.open_kw):
            yield self.row_mapper(row) if self.row_mapper else row


def criteo_terabyte(paths: Iterable[str], *, row_mapper: Optional[Callable[[List[str]], Any]] = _default_row_mapper,
                    **open_kw: Any) -> CriteoIterDataPipe:
    """The Criteo 1TB click logs' day files (local TSV paths), one row dict per line."""
    return CriteoIterDataPipe(paths, row_mapper=row_mapper, **open_kw)


def criteo_kaggle(path: str, *, row_mapper: Optional[Callable[[List[str]], Any]] = _default_row_mapper,
                  **open_kw: Any) -> CriteoIterDataPipe:
    """The Kaggle Display Advertising train.txt or test.txt (test rows have no label), one row dict per line."""
    return CriteoIterDataPipe((path,), row_mapper=row_mapper, **open_kw)


def _npy_row(row: List[str], has_label: bool) -> Tuple[List[int], List[int], int]:
    """(13 ints, 26 ids, label) of a split line; missing values are 0, a test line's label is -1."""
    first = 1 if has_label else 0
    dense = [int(text or "0") for text in row[first:first + INT_FEATURE_COUNT]]
    sparse = [int(text or "0", 16) for text in row[first + INT_FEATURE_COUNT:first + INT_FEATURE_COUNT + CAT_FEATURE_COUNT]]
    return dense, sparse, int(row[0] or "0") if has_label else -1


class BinaryCriteoUtils:
    """Criteo's npy form: write it from a TSV file, read its shape and row ranges (TorchRec's helpers that
    work on local files; sparse_to_contiguous and shuffle are not implemented)."""

    @staticmethod
    def tsv_to_npys(in_file: str, out_dense_file: str, out_sparse_file: str, out_labels_file: str,
                    dataset_name: str = "criteo_1tb", path_manager_key: str = _DEFAULT_PATH_MANAGER) -> None:
        """One TSV file -> dense (float32), sparse (int64) and labels (int32) npy files. The Kaggle test file
        ("criteo_kaggle" with "test" in its name) has no label column: its labels are -1."""
        _local_only("tsv_to_npys", path_manager_key)
        if dataset_name not in ("criteo_1tb", "criteo_kaggle"):
            raise ValueError(f"tsv_to_npys: dataset_name={dataset_name!r}; use 'criteo_1tb' or 'criteo_kaggle'")
        has_label = not (dataset_name == "criteo_kaggle" and "test" in in_file)
        rows = [_npy_row(row, has_label) for row in read_csv_rows([in_file], delimiter="\t")]
        if not rows:
            raise ValueError(f"tsv_to_npys: {in_file} has no lines")
        dense = np.array([dense for dense, _, _ in rows], dtype=np.int64)
        dense = np.log(dense - dense.min() + 2, dtype=np.float32)  # TorchRec shifts by the file's minimum
        sparse = np.array([sparse for _, sparse, _ in rows], dtype=np.int64)
        labels = np.array([label for _, _, label in rows], dtype=np.int32).reshape(-1, 1)
        for path, array in ((out_dense_file, dense), (out_sparse_file, sparse), (out_labels_file, labels)):
            with open(path, "wb") as handle:
                np.save(handle, array)

    @staticmethod
    def get_shape_from_npy(path: str, path_manager_key: str = _DEFAULT_PATH_MANAGER) -> Tuple[int, ...]:
        """The shape of an npy file, from its header only."""
        _local_only("get_shape_from_npy", path_manager_key)
        return tuple(np.load(path, mmap_mode="r").shape)

    @staticmethod
    def load_npy_range(fname: str, start_row: int, num_rows: int, path_manager_key: str = _DEFAULT_PATH_MANAGER,
                       mmap_mode: bool = False) -> np.ndarray:
        """Rows [start_row, start_row + num_rows) of a 2-D npy file, reading only those rows."""
        _local_only("load_npy_range", path_manager_key)
        array = np.load(fname, mmap_mode="r")
        if array.ndim != 2:
            raise ValueError(f"load_npy_range: {fname} has {array.ndim} dimensions; only 2-D arrays load by range")
        if not 0 <= start_row < array.shape[0]:
            raise ValueError(f"start_row ({start_row}) is out of bounds. It must be between 0 and "
                             f"{array.shape[0] - 1}, inclusive.")
        if start_row + num_rows > array.shape[0]:
            raise ValueError(f"num_rows ({num_rows}) exceeds number of available rows ({array.shape[0]}) for the "
                             f"given start_row ({start_row}).")
        rows = array[start_row:start_row + num_rows]
        return rows if mmap_mode else np.array(rows)


class InMemoryBinaryCriteoIterDataPipe(IterableDataset):
    """Batches from Criteo npy files, loaded whole; global batch i goes to rank i % world_size (TorchRec's
    order). stage "val" / "test" use the first / second half of the first file. Without drop_last the
    remainder is spread over the ranks as last, smaller batches (at least one sample each).

    shuffle_batches permutes the samples inside each batch (numpy's global generator, seeded with
    shuffle_training_set_random_seed as TorchRec does); shuffle_training_set is not implemented.
    """

    def __init__(self, stage: str, dense_paths: List[str], sparse_paths: List[str], labels_paths: List[str],
                 batch_size: int, rank: int, world_size: int, drop_last: Optional[bool] = False,
                 shuffle_batches: bool = False, shuffle_training_set: bool = False,
                 shuffle_training_set_random_seed: int = 0, mmap_mode: bool = False, hashes: Optional[List[int]] = None,
                 path_manager_key: str = _DEFAULT_PATH_MANAGER) -> None:
        super().__init__()
        _local_only("InMemoryBinaryCriteoIterDataPipe", path_manager_key)
        if shuffle_training_set:
            raise NotImplementedError("InMemoryBinaryCriteoIterDataPipe: shuffle_training_set=True is not "
                                      "implemented; shuffle the npy files beforehand or pass False")
        if stage not in ("train", "val", "test"):
            raise ValueError(f"InMemoryBinaryCriteoIterDataPipe: stage={stage!r}; use 'train', 'val' or 'test'")
        if not len(dense_paths) == len(sparse_paths) == len(labels_paths) > 0:
            raise ValueError(f"InMemoryBinaryCriteoIterDataPipe: {len(dense_paths)} dense, {len(sparse_paths)} "
                             f"sparse and {len(labels_paths)} labels files; give one of each per day (at least one)")
        if not 0 <= rank < world_size:
            raise ValueError(f"InMemoryBinaryCriteoIterDataPipe: rank {rank} is not in [0, world_size={world_size})")
        self.stage, self.batch_size, self.rank, self.world_size = stage, batch_size, rank, world_size
        self.shuffle_batches = shuffle_batches
        np.random.seed(shuffle_training_set_random_seed)
        mode = "r" if mmap_mode else None
        arrays = [[np.load(path, mmap_mode=mode) for path in paths] for paths in (dense_paths, sparse_paths, labels_paths)]
        if stage != "train":
            half = (len(arrays[0][0]) + 1) // 2
            for kind in arrays:
                kind[0] = kind[0][:half] if stage == "val" else kind[0][half:]
        self.hashes = None if hashes is None else np.asarray(hashes).reshape(1, CAT_FEATURE_COUNT)
        self.dense_arrs, self.sparse_arrs, self.labels_arrs = (np.concatenate(kind) for kind in arrays)
        total_rows = len(self.dense_arrs)
        self.num_full_batches = total_rows // batch_size // world_size * world_size
        self.last_batch_sizes = np.zeros(world_size, dtype=np.int64)
        remainder = total_rows - self.num_full_batches * batch_size
        if not drop_last and remainder > 0:
            if remainder < world_size:  # too few for one sample per rank: fold the last full round in
                self.num_full_batches -= world_size
                self.last_batch_sizes += batch_size
            else:
                self.last_batch_sizes += remainder // world_size
            self.last_batch_sizes[:remainder % world_size] += 1
        self.keys = list(DEFAULT_CAT_NAMES)

    def _batch_sizes(self) -> List[int]:
        sizes = [self.batch_size] * self.num_full_batches
        if self.last_batch_sizes[0] > 0:
            sizes += [int(size) for size in self.last_batch_sizes]
        return sizes

    def _to_batch(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
        if self.shuffle_batches:
            order = np.random.permutation(len(dense))
            dense, sparse, labels = dense[order], sparse[order], labels[order]
        if self.hashes is not None:
            sparse = sparse % self.hashes
        size = len(dense)
        features = KeyedJaggedTensor.from_lengths_sync(
            keys=self.keys, values=torch.from_numpy(np.ascontiguousarray(sparse.T).reshape(-1)),
            lengths=torch.ones(CAT_FEATURE_COUNT * size, dtype=torch.int32))
        return Batch(dense_features=torch.from_numpy(np.array(dense)), sparse_features=features,
                     labels=torch.from_numpy(np.array(labels).reshape(-1)))

    def __iter__(self) -> Iterator[Batch]:
        start = 0
        for index, size in enumerate(self._batch_sizes()):
            if index % self.world_size == self.rank:
                rows = slice(start, start + size)
                yield self._to_batch(self.dense_arrs[rows], self.sparse_arrs[rows], self.labels_arrs[rows])
            start += size

    def __len__(self) -> int:
        return self.num_full_batches // self.world_size + int(self.last_batch_sizes[0] > 0)


__all__ = ["BinaryCriteoUtils", "CAT_FEATURE_COUNT", "DAYS", "DEFAULT_CAT_NAMES", "DEFAULT_COLUMN_NAMES",
           "DEFAULT_INT_NAMES", "DEFAULT_LABEL_NAME", "FREQUENCY_THRESHOLD", "INT_FEATURE_COUNT", "TOTAL_TRAINING_SAMPLES",
           "CriteoIterDataPipe", "InMemoryBinaryCriteoIterDataPipe", "criteo_kaggle", "criteo_terabyte"]
