"""MovieLens ratings at TorchRec's path (`torchrec.datasets.movielens`): `movielens_20m` / `movielens_25m` read
ratings.csv (and movies.csv) from a local folder, one dict per rating.

    >>> import tempfile, os
    >>> root = tempfile.mkdtemp()
    >>> _ = open(os.path.join(root, "ratings.csv"), "w").write("userId,movieId,rating,timestamp\\n7,2,4.5,964982703\\n")
    >>> _ = open(os.path.join(root, "movies.csv"), "w").write('movieId,title,genres\\n2,"Jumanji (1995)",Adventure\\n')
    >>> next(iter(movielens_20m(root, include_movies_data=True)))
    {'userId': 7, 'movieId': 2, 'rating': 4.5, 'timestamp': 964982703, 'title': 'Jumanji (1995)', 'genres': 'Adventure'}

A value that does not convert becomes 0 (0.0, ""), as in TorchRec; a rating of a movie missing from movies.csv
raises a KeyError naming the movie.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

from torch.utils.data import IterDataPipe

from rectoolkit.datasets.utils import read_csv_rows, safe_cast

RATINGS_FILENAME = "ratings.csv"
MOVIES_FILENAME = "movies.csv"
DEFAULT_RATINGS_COLUMN_NAMES: List[str] = ["userId", "movieId", "rating", "timestamp"]
DEFAULT_MOVIES_COLUMN_NAMES: List[str] = ["movieId", "title", "genres"]
DEFAULT_COLUMN_NAMES: List[str] = DEFAULT_RATINGS_COLUMN_NAMES + DEFAULT_MOVIES_COLUMN_NAMES[1:]
_COLUMN_TYPES = [(int, 0), (int, 0), (float, 0.0), (int, 0), (str, ""), (str, "")]


def _default_row_mapper(example: List[str]) -> Dict[str, Union[float, int, str]]:
    """A split rating line (optionally joined with its movie) -> {column name: typed value}."""
    return {name: safe_cast(text, kind, default)
            for name, (kind, default), text in zip(DEFAULT_COLUMN_NAMES, _COLUMN_TYPES, example)}


class MovieLensRatings(IterDataPipe):
    """The ratings of a MovieLens folder, each line through `row_mapper` (None: the split line as strings)."""

    def __init__(self, root: str, include_movies_data: bool = False,
                 row_mapper: Optional[Callable[[List[str]], Any]] = _default_row_mapper, **open_kw: Any) -> None:
        super().__init__()
        self.ratings_path = os.path.join(root, RATINGS_FILENAME)
        self.movies_path = os.path.join(root, MOVIES_FILENAME) if include_movies_data else None
        for path in filter(None, (self.ratings_path, self.movies_path)):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"MovieLens: {path} does not exist; root must be the unpacked ml-20m / "
                                        f"ml-25m folder holding {RATINGS_FILENAME} and {MOVIES_FILENAME}")
        self.row_mapper = row_mapper
        self.open_kw = open_kw

    def __iter__(self) -> Iterator[Any]:
        movies: Dict[str, List[str]] = {}
        if self.movies_path is not None:
            movies = {row[0]: row[1:] for row in read_csv_rows([self.movies_path], ",", skip_first_line=True)}
        for row in read_csv_rows([self.ratings_path], ",", skip_first_line=True, **self.open_kw):
            if self.movies_path is not None:
                if row[1] not in movies:
                    raise KeyError(f"MovieLens: {self.ratings_path} rates movieId {row[1]} which {self.movies_path} "
                                   "does not list")
                row = row + movies[row[1]]
            yield self.row_mapper(row) if self.row_mapper else row


def movielens_20m(root: str, *, include_movies_data: bool = False,
                  row_mapper: Optional[Callable[[List[str]], Any]] = _default_row_mapper,
                  **open_kw: Any) -> MovieLensRatings:
    """MovieLens 20M (grouplens.org/datasets/movielens/20m) from the local folder `root`."""
    return MovieLensRatings(root, include_movies_data, row_mapper, **open_kw)


def movielens_25m(root: str, *, include_movies_data: bool = False,
                  row_mapper: Optional[Callable[[List[str]], Any]] = _default_row_mapper,
                  **open_kw: Any) -> MovieLensRatings:
    """MovieLens 25M (grouplens.org/datasets/movielens/25m) from the local folder `root`."""
    return MovieLensRatings(root, include_movies_data, row_mapper, **open_kw)


__all__ = ["DEFAULT_COLUMN_NAMES", "DEFAULT_MOVIES_COLUMN_NAMES", "DEFAULT_RATINGS_COLUMN_NAMES", "MOVIES_FILENAME",
           "MovieLensRatings", "RATINGS_FILENAME", "movielens_20m", "movielens_25m"]
