"""Read Criteo-format click logs (Kaggle Display Advertising / Terabyte day files) as training batches.

One sample per line, tab-separated, no header: the label (0/1), 13 integer columns, 26 categorical columns
of 8 hex digits; any column may be empty (missing).

    1\t5\t\t3\t...(13 ints)...\t68fd1e64\t\t...(26 hex)...

- integer columns become dense features log(1 + max(x, 0)); missing -> 0 (as TorchRec's Criteo pipeline,
  which also clamps negatives and log-transforms);
- categorical column i becomes feature i's id `int(hex, 16) % num_embeddings` of that feature's table
  ("hashed into the table sizes"); a missing value is an empty bag (length 0);
- the file is cut into global batches of `batch_size * world_size` consecutive lines and rank r takes lines
  [r * batch_size, (r + 1) * batch_size) of each; a last incomplete global batch is dropped so every rank
  steps the same number of times.

    >>> line = "1\\t3\\t\\t-1" + "\\t0" * 10 + "\\t0000000a" + "\\t" * 25
    >>> label, ints, cats = parse_criteo_line(line)
    >>> label, ints[:3], cats[:2]
    (1, [3, None, -1], ['0000000a', None])
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch

from rectoolkit.modules.configs import EmbeddingBagConfig
from rectoolkit.sparse import KeyedJaggedTensor
from rectoolkit.train.data import Batch

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE


def parse_criteo_line(line: str, where: str = "") -> Tuple[int, List[Optional[int]], List[Optional[str]]]:
    """Split one line into (label, 13 ints or None, 26 hex strings or None)."""
    fields = line.rstrip("\n").rstrip("\r").split("\t")
    if len(fields) != NUM_COLUMNS:
        raise ValueError(f"Criteo line{where} has {len(fields)} tab-separated columns, expected {NUM_COLUMNS} "
                         f"(label, {NUM_DENSE} integers, {NUM_SPARSE} categoricals); is this a Criteo TSV file?")
    try:
        label = int(fields[0])
        ints = [int(f) if f else None for f in fields[1:1 + NUM_DENSE]]
    except ValueError as exc:
        raise ValueError(f"Criteo line{where}: label or integer column is not an integer ({exc})") from exc
    cats = [f if f else None for f in fields[1 + NUM_DENSE:]]
    return label, ints, cats


class CriteoTSV:
    """Batches (dense [B, 13], KJT of 26 features, labels [B]) from Criteo TSV files, for one rank.

    Args:
        paths: one file or several, read in order.
        tables: EmbeddingBagConfigs whose features, in order, are the 26 categorical columns (e.g. the
            "dlrm26" workload's tables; `feature_names` can reorder).
        batch_size: samples per rank per batch.
        rank, world_size: which slice of every global batch this reader returns.
        feature_names: the feature of each categorical column (default: the tables' features in order).
        max_rows: stop after this many lines (handy for quick runs on a big day file).
    """

    def __init__(self, paths: Union[str, Path, Sequence[Union[str, Path]]], tables: Sequence[EmbeddingBagConfig],
                 batch_size: int, rank: int = 0, world_size: int = 1, feature_names: Optional[Sequence[str]] = None,
                 max_rows: Optional[int] = None) -> None:
        self.paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
        rows_of_feature = {f: t.num_embeddings for t in tables for f in t.feature_names}
        self.feature_names = list(feature_names or rows_of_feature)
        if len(self.feature_names) != NUM_SPARSE:
            raise ValueError(f"Criteo files have {NUM_SPARSE} categorical columns but {len(self.feature_names)} "
                             f"features were given ({self.feature_names[:5]}...); pass 26 features, e.g. the "
                             f"'dlrm26' workload's tables")
        unknown = [f for f in self.feature_names if f not in rows_of_feature]
        if unknown:
            raise ValueError(f"feature_names {unknown} are not features of the given tables")
        self.num_rows = [rows_of_feature[f] for f in self.feature_names]
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.max_rows = max_rows

    def _lines(self) -> Iterator[Tuple[str, str]]:
        count = 0
        for path in self.paths:
            with open(path, "r") as handle:
                for number, line in enumerate(handle, start=1):
                    if self.max_rows is not None and count >= self.max_rows:
                        return
                    if line.strip():
                        count += 1
                        yield line, f" {number} of {path}"

    def _make_batch(self, rows: List[Tuple[int, List[Optional[int]], List[Optional[str]]]]) -> Batch:
        labels = torch.tensor([float(label) for label, _, _ in rows])
        dense = torch.tensor([[math.log1p(max(x, 0)) if x is not None else 0.0 for x in ints] for _, ints, _ in rows],
                             dtype=torch.float32)
        lengths: List[int] = []
        values: List[int] = []
        for column, rows_in_table in enumerate(self.num_rows):  # KJT order: feature-major
            for _, _, cats in rows:
                value = cats[column]
                if value is None:
                    lengths.append(0)
                else:
                    lengths.append(1)
                    values.append(int(value, 16) % rows_in_table)
        sparse = KeyedJaggedTensor.from_lengths_sync(keys=list(self.feature_names),
                                                     values=torch.tensor(values, dtype=torch.int64),
                                                     lengths=torch.tensor(lengths, dtype=torch.int64))
        return Batch(dense, sparse, labels)

    def __iter__(self) -> Iterator[Batch]:
        global_size = self.batch_size * self.world_size
        first, last = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        position, mine = 0, []
        for line, where in self._lines():
            if first <= position < last:
                mine.append(parse_criteo_line(line, where))
            position += 1
            if position == global_size:
                yield self._make_batch(mine)
                position, mine = 0, []
