"""FeatureProcessedEmbeddingBagCollection (position weights) under DistributedModelParallel on 2 gloo ranks equals
the unsharded model: outputs, then tables, position weights and dense weights after 2 training steps."""

from __future__ import annotations

import pytest

from dist_fp_workers import fp_dmp_worker, fp_sharder_worker
from dist_harness import run_workers


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_two_ranks_fp_ebc_equals_unsharded():
    run_workers(fp_dmp_worker, 2, ["table_wise", "row_wise", "mixed_a"], "fp._embedding_bag_collection")


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_plan_keyed_by_the_feature_processed_collection_as_torchrec():
    run_workers(fp_dmp_worker, 2, ["column_wise"], "fp")


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_feature_processed_sharder_plans_at_its_path_and_passes_its_fused_params():
    run_workers(fp_sharder_worker, 2)
