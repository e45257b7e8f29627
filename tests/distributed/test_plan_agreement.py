"""Ranks handed different plans (a stale plan file on one host) refuse to shard, naming the ranks and the first
table that differs; the same plan built in another order on each rank is accepted."""

from __future__ import annotations

import pytest

from dist_fault_workers import plan_mismatch_worker
from dist_harness import run_workers


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_ranks_with_different_plans_refuse_to_shard():
    run_workers(plan_mismatch_worker, 2)
