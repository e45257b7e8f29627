"""The equivalence and VBE workers with row-block routing forced to number and sort ids (the path large batches on
CPU take; the tests' small batches would otherwise take the per-block masks)."""

from __future__ import annotations

from typing import List

from dist_vbe_workers import vbe_worker
from dist_workers import equivalence_worker


def _number_every_batch() -> None:
    from rectoolkit.distributed import row_wise

    row_wise._MASKED_IDS = 0


def numbered_equivalence_worker(rank: int, W: int, cases: List[tuple], result_file: str) -> None:
    _number_every_batch()
    equivalence_worker(rank, W, cases, result_file)


def numbered_vbe_worker(rank: int, W: int, cases: List[tuple], result_file: str) -> None:
    _number_every_batch()
    vbe_worker(rank, W, cases, result_file)
