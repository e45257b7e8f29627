"""`Batch` at TorchRec's path (`torchrec.datasets.utils`): dense_features, sparse_features (a KJT), labels; the
small readers the dataset loaders share (`safe_cast`, `read_csv_rows`); and, from rectoolkit.datasets.pipes, the
splits and datapipes TorchRec keeps here (`idx_split_train_val`, `rand_split_train_val`, `Limit`, ...).

    >>> safe_cast("12", int, 0), safe_cast("", int, 0), safe_cast("x", float, 0.0)
    (12, 0, 0.0)
"""

from __future__ import annotations

import csv
from typing import Any, Callable, Iterable, Iterator, List, TypeVar

from rectoolkit.datasets.pipes import (Limit, LoadFiles, ParallelReadConcat, ReadLinesFromCSV, idx_split_train_val,
                                       rand_split_train_val, train_filter, val_filter)
from rectoolkit.train.data import Batch

T = TypeVar("T")


def safe_cast(val: Any, dest_type: Callable[[Any], T], default: T) -> T:
    """`dest_type(val)`, or `default` when the text does not convert (TorchRec's missing-value rule)."""
    try:
        return dest_type(val)
    except ValueError:
        return default


def read_csv_rows(paths: Iterable[str], delimiter: str, skip_first_line: bool = False, **open_kw: Any
                  ) -> Iterator[List[str]]:
    """The rows of text files, split by the csv module, one file after the other (`open_kw` go to open())."""
    for path in paths:
        with open(path, "r", newline="", **open_kw) as handle:
            reader = csv.reader(handle, delimiter=delimiter)
            if skip_first_line:
                next(reader, None)
            yield from reader


__all__ = ["Batch", "Limit", "LoadFiles", "ParallelReadConcat", "ReadLinesFromCSV", "idx_split_train_val",
           "rand_split_train_val", "read_csv_rows", "safe_cast", "train_filter", "val_filter"]
