"""ParameterSharding's compute kernel: "dense" by default for DATA_PARALLEL (TorchRec's only kernel for a replica),
"fused" for the other types; another kernel on a DATA_PARALLEL entry is refused, naming it and the fix. Plan files
read by rectoolkit.plan.serialization: tests/plan/test_serialization.py."""

import pytest

from rectoolkit.plan.types import EmbeddingComputeKernel, ParameterSharding, ShardingType


@pytest.mark.parametrize("sharding_type", ["data_parallel", ShardingType.DATA_PARALLEL, "DATA_PARALLEL"])
def test_a_data_parallel_entry_defaults_to_the_dense_kernel(sharding_type):
    assert ParameterSharding(sharding_type, ranks=[0, 1]).compute_kernel == "dense"
    assert ParameterSharding(sharding_type, "dense", ranks=[0, 1]).compute_kernel == "dense"
    assert ParameterSharding(sharding_type, EmbeddingComputeKernel.DENSE).kernel == EmbeddingComputeKernel.DENSE


@pytest.mark.parametrize("sharding_type", ["table_wise", "row_wise", "column_wise", "grid_shard"])
def test_the_other_types_default_to_fused(sharding_type):
    assert ParameterSharding(sharding_type, ranks=[0]).compute_kernel == "fused"


@pytest.mark.parametrize("kernel", ["fused", "fused_uvm", EmbeddingComputeKernel.FUSED_UVM_CACHING, "quant"])
def test_another_kernel_on_a_data_parallel_entry_is_refused(kernel):
    name = EmbeddingComputeKernel.parse(kernel).value
    with pytest.raises(ValueError, match=rf"ParameterSharding: a data_parallel table has compute_kernel '{name}'.*"
                                         r"use compute_kernel=\"dense\""):
        ParameterSharding("data_parallel", kernel, ranks=[0, 1])


def test_the_default_is_torchrecs():
    pytest.importorskip("torchrec")
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import data_parallel

    sharder = EmbeddingBagCollectionSharder()
    assert sharder.compute_kernels("data_parallel", "cpu") == ["dense"]  # the only kernel TorchRec offers
    theirs = data_parallel()(torch.nn.Parameter(torch.empty(5, 4)), 2, 2, "cpu", sharder)
    assert ParameterSharding("data_parallel").compute_kernel == theirs.compute_kernel
