"""ManagedCollisionEmbeddingBagCollection / ManagedCollisionEmbeddingCollection under DistributedModelParallel on 2 gloo ranks (ROW_WISE, the managed-
collision modules cut with their tables) equals the per-block reference on the global batch."""

from __future__ import annotations

import pytest

from dist_harness import run_workers
from dist_mc_workers import mc_dmp_worker


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
@pytest.mark.parametrize("plan_key,pooled", [("mc", True), ("mc._embedding_module", True), ("mc", False)])
def test_two_ranks_mc_collection_equals_per_block_reference(plan_key, pooled):
    run_workers(mc_dmp_worker, 2, plan_key, pooled)
