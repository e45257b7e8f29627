"""rectoolkit.distributed.collective_utils against TorchRec 1.8's on 2 gloo ranks (same calls, same process)."""

from __future__ import annotations

import doctest

import pytest
import torch

from rectoolkit.distributed import collective_utils

from dist_collective_utils_workers import bad_rank_worker, broadcast_worker, share_worker
from dist_harness import run_workers

pytest.importorskip("torchrec.distributed.collective_utils")
pytestmark = [pytest.mark.torchrec, pytest.mark.multiprocess]


def test_docstring_examples():
    assert doctest.testmod(collective_utils).failed == 0


def test_is_leader_invoke_and_run_on_leader_on_each_rank():
    run_workers(broadcast_worker, 2)


def test_create_on_rank_and_share_result_maps_the_same_memory():
    run_workers(share_worker, 2)


def test_a_rank_outside_the_group_is_refused_on_every_rank():
    run_workers(bad_rank_worker, 2)


class _OneRankGroup:
    """A group of one process: nothing is broadcast."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def test_a_tensor_off_the_cpu_is_refused_with_its_position():
    made = [torch.zeros(2), torch.empty(2, device="meta")]
    with pytest.raises(ValueError, match="tensor 1 of the extractor's list is on meta"):
        collective_utils.create_on_rank_and_share_result(_OneRankGroup(), 0, lambda: made, list, list)


def test_one_rank_group_returns_the_creators_result():
    from torchrec.distributed import collective_utils as theirs

    for lib in (collective_utils, theirs):
        made = [torch.ones(2), None]
        assert lib.create_on_rank_and_share_result(_OneRankGroup(), 0, lambda: made, list, list) is made
        assert lib.invoke_on_rank_and_broadcast_result(_OneRankGroup(), 0, sum, [1, 2]) == 3
