"""The small datapipes TorchRec's dataset scripts compose (`torchrec.datasets.utils`): train/validation splits
by index or by a seeded draw, `Limit`, file readers and `ParallelReadConcat` for DataLoader workers. Each is a
torch IterDataPipe, so `.batch()`, `.map()`, `.shuffle()` ... chain after it as in TorchRec; splits are TorchRec's
sample for sample (the same index rule, the same `random.Random(seed)` draws).

    >>> train, val = idx_split_train_val(list(range(10)), 0.7, decimal_places=1)  # i mod 10 < 7: train
    >>> list(train), list(val)
    ([0, 1, 2, 3, 4, 5, 6], [7, 8, 9])
    >>> train, val = rand_split_train_val(list(range(8)), 0.5, random_seed=1)
    >>> sorted(list(train) + list(val)) == list(range(8)), list(train) == list(train)  # disjoint, repeatable
    (True, True)
    >>> list(Limit(range(100), 3))
    [0, 1, 2]
"""

from __future__ import annotations

import csv
import math
import random
from functools import partial
from typing import IO, Any, Callable, Iterable, Iterator, List, Sequence, Tuple

from torch.utils.data import IterDataPipe, get_worker_info


def _check_train_perc(train_perc: float) -> None:
    if isinstance(train_perc, bool) or not isinstance(train_perc, (int, float)) or not 0.0 < train_perc < 1.0:
        raise ValueError(f"train_perc must be in range (0.0, 1.0), got {train_perc!r}: the share of samples that go "
                         "to the training split, e.g. 0.9")


def train_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int, idx: int) -> bool:
    """True if sample `idx` is in the training split: key_fn(idx) mod 10^decimal_places below train_perc of it."""
    return (key_fn(idx) % 10**decimal_places) < round(train_perc * 10**decimal_places)


def val_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int, idx: int) -> bool:
    """True if sample `idx` is in the validation split (not in the training one)."""
    return not train_filter(key_fn, train_perc, decimal_places, idx)


class _IdxFilter(IterDataPipe):
    def __init__(self, datapipe: Iterable[Any], filter_fn: Callable[[int], bool]) -> None:
        super().__init__()
        self.datapipe, self.filter_fn = datapipe, filter_fn

    def __iter__(self) -> Iterator[Any]:
        for idx, data in enumerate(self.datapipe):
            if self.filter_fn(idx):
                yield data


def _identity(idx: int) -> int:
    return idx


def idx_split_train_val(datapipe: Iterable[Any], train_perc: float, decimal_places: int = 2,
                        key_fn: Callable[[int], int] = _identity) -> Tuple[IterDataPipe, IterDataPipe]:
    """Two disjoint pipes over `datapipe`, train and validation, by sample index: sample i is in train when
    key_fn(i) mod 10^decimal_places < round(train_perc x 10^decimal_places) (so 0.7 takes 70 of every 100)."""
    _check_train_perc(train_perc)
    if isinstance(decimal_places, bool) or not isinstance(decimal_places, int) or decimal_places < 0:
        raise ValueError(f"decimal_places must be an int >= 0, got {decimal_places!r}")
    return (_IdxFilter(datapipe, partial(train_filter, key_fn, train_perc, decimal_places)),
            _IdxFilter(datapipe, partial(val_filter, key_fn, train_perc, decimal_places)))


class _RandFilter(IterDataPipe):
    """Keeps a sample when `keep(draw)`, one draw of a random.Random per sample, the generator reset to its seed
    state at every pass: each pass (and the twin split) sees the same draws."""

    def __init__(self, datapipe: Iterable[Any], train_perc: float, random_seed: int, train: bool) -> None:
        super().__init__()
        self.datapipe, self.train_perc, self.train = datapipe, train_perc, train
        self.rand_gen = random.Random(random_seed)
        self.rand_gen_init_state = self.rand_gen.getstate()

    def __iter__(self) -> Iterator[Any]:
        self.rand_gen.setstate(self.rand_gen_init_state)
        for data in self.datapipe:
            if (self.rand_gen.random() < self.train_perc) == self.train:
                yield data


def rand_split_train_val(datapipe: Iterable[Any], train_perc: float,
                         random_seed: int = 0) -> Tuple[IterDataPipe, IterDataPipe]:
    """Two disjoint pipes over `datapipe`, train and validation, by a uniform draw per sample from
    random.Random(random_seed): a sample is in train when its draw is below train_perc. The same seed gives the
    same split on every pass and every process (the share is train_perc on average, not exactly)."""
    _check_train_perc(train_perc)
    return (_RandFilter(datapipe, train_perc, random_seed, train=True),
            _RandFilter(datapipe, train_perc, random_seed, train=False))


class Limit(IterDataPipe):
    """The first `limit` samples of `datapipe`. Not registered as `pipe.limit(n)`: a name registers once per
    process, and importing torchrec.datasets after it would fail (with TorchRec imported, `.limit` is TorchRec's)."""

    def __init__(self, datapipe: Iterable[Any], limit: int) -> None:
        super().__init__()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"Limit: limit must be an int >= 0 (the number of samples to keep), got {limit!r}")
        self.datapipe, self.limit = datapipe, limit

    def __iter__(self) -> Iterator[Any]:
        for idx, data in enumerate(self.datapipe):
            if idx >= self.limit:
                break
            yield data


class LoadFiles(IterDataPipe):
    """(path, open file) for each local path of `datapipe`; mode "b"/"t"/"rb"/"rt"/"r", `open_kw` go to open().
    TorchRec opens through iopath's PathManager; here only local files (path_manager_key must stay "torchrec")."""

    def __init__(self, datapipe: Iterable[str], mode: str = "b", length: int = -1,
                 path_manager_key: str = "torchrec", **open_kw: Any) -> None:
        super().__init__()
        if mode not in ("b", "t", "rb", "rt", "r"):
            raise ValueError(f"LoadFiles: invalid mode {mode!r}; use one of 'b', 't', 'rb', 'rt', 'r'")
        if path_manager_key != "torchrec":
            raise NotImplementedError(f"LoadFiles: path_manager_key={path_manager_key!r} is not implemented; "
                                      "rectoolkit reads local files only (leave the default)")
        self.datapipe, self.mode, self.length, self.open_kw = datapipe, mode, length, open_kw

    def __iter__(self) -> Iterator[Tuple[str, IO]]:
        mode = "r" + self.mode if self.mode in ("b", "t") else self.mode
        for pathname in self.datapipe:
            if not isinstance(pathname, str):
                raise TypeError(f"LoadFiles: expected a path (str), got {type(pathname).__name__} {pathname!r}")
            yield pathname, open(pathname, mode, **self.open_kw)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError("LoadFiles: no length was given (length=-1)")
        return self.length


class ReadLinesFromCSV(IterDataPipe):
    """The rows of each (name, text stream) of `datapipe`, split by csv.reader(**kw); the first line skipped
    when `skip_first_line`."""

    def __init__(self, datapipe: Iterable[Tuple[str, IO]], skip_first_line: bool = False, **kw: Any) -> None:
        super().__init__()
        self.datapipe, self.skip_first_line, self.kw = datapipe, skip_first_line, kw

    def __iter__(self) -> Iterator[List[str]]:
        for _, data in self.datapipe:
            reader = csv.reader(data, **self.kw)
            if self.skip_first_line:
                next(reader, None)
            yield from reader


def _default_dp_selector(datapipes: Sequence[Any]) -> Sequence[Any]:
    """Outside a DataLoader worker every pipe; in worker k of n, its contiguous share (the first workers take
    one more when the pipes do not divide evenly)."""
    worker_info = get_worker_info()
    if worker_info is None:
        return datapipes
    if worker_info.num_workers > len(datapipes):
        raise ValueError(f"ParallelReadConcat: {worker_info.num_workers} DataLoader workers but only {len(datapipes)} "
                         "datapipes; each worker reads whole datapipes, so use at most as many workers as datapipes")
    offsets = [0]
    for num_workers in reversed(range(1, worker_info.num_workers + 1)):
        offsets.append(offsets[-1] + math.ceil((len(datapipes) - offsets[-1]) / num_workers))
    return datapipes[offsets[worker_info.id]:offsets[worker_info.id + 1]]


class ParallelReadConcat(IterDataPipe):
    """The samples of several pipes one after the other; in a DataLoader with workers each worker reads its own
    share of the pipes (`dp_selector`), so the workers read in parallel and every sample comes once."""

    def __init__(self, *datapipes: Iterable[Any],
                 dp_selector: Callable[[Sequence[Any]], Sequence[Any]] = _default_dp_selector) -> None:
        super().__init__()
        self.datapipes, self.dp_selector = datapipes, dp_selector

    def __iter__(self) -> Iterator[Any]:
        for datapipe in self.dp_selector(self.datapipes):
            yield from datapipe


__all__ = ["Limit", "LoadFiles", "ParallelReadConcat", "ReadLinesFromCSV", "idx_split_train_val",
           "rand_split_train_val", "train_filter", "val_filter"]
