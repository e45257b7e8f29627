"""Small hand-made plans shared by the viz tests."""

import pytest

from rectoolkit.modules.configs import DataType, EmbeddingBagConfig
from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata


@pytest.fixture
def tables():
    return [
        EmbeddingBagConfig(name="big", num_embeddings=1000, embedding_dim=8, feature_names=["f_big"]),
        EmbeddingBagConfig(name="wide", num_embeddings=100, embedding_dim=16, feature_names=["f_wide"]),
        EmbeddingBagConfig(name="small", num_embeddings=10, embedding_dim=4, feature_names=["f_small"],
                           data_type=DataType.FP16),
    ]


@pytest.fixture
def plan():
    """big: row-wise over 2 ranks (600 + 400 rows); wide: column-wise 2 x 8 cols on ranks 1, 0;
    small: data parallel on both ranks."""
    return ShardingPlan({"": {
        "big": ParameterSharding("row_wise", ranks=[0, 1], shards=[
            ShardMetadata.on_rank(0, 0, 0, 600, 8), ShardMetadata.on_rank(1, 600, 0, 400, 8)]),
        "wide": ParameterSharding("column_wise", ranks=[1, 0], shards=[
            ShardMetadata.on_rank(1, 0, 0, 100, 8), ShardMetadata.on_rank(0, 0, 8, 100, 8)]),
        "small": ParameterSharding("data_parallel", ranks=[0, 1], shards=[
            ShardMetadata.on_rank(0, 0, 0, 10, 4), ShardMetadata.on_rank(1, 0, 0, 10, 4)]),
    }})
