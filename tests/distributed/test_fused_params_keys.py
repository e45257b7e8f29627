"""TorchRec's fused_params keys on rectoolkit's sharders: gradient clipping as fbgemm clips (each bag's output
gradient clamped before per-id weights and before duplicate ids are summed: the expected rows below are worked out
by hand from that rule, and fbgemm's own TBE is run on the same case), the per-table options given once for every
table (honoured or refused by name, as the plan's are), and the keys fbgemm's optimizers do not read."""

from __future__ import annotations

import pytest
import torch

import rectoolkit as rtk
from rectoolkit.distributed import ShardingEnv
from rectoolkit.distributed.fused_params import with_table_options
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
from rectoolkit.kernels import FusedOptimizerConfig, fbgemm_available
from rectoolkit.kernels.batched_embedding import TableSpec, make_batched_embedding
from rectoolkit.modules.configs import DataType

BACKENDS = ["torch"] + (["fbgemm"] if fbgemm_available() else [])

# one table of 4 rows x 4; bags [1, 1] and [2] (id 1 twice: its gradients are summed), weights 3.0, 0.1, 0.2
IDS, OFFSETS, WEIGHTS = torch.tensor([1, 1, 2]), torch.tensor([0, 2, 3]), torch.tensor([3.0, 0.1, 0.2])
GRAD = torch.tensor([[0.3, -0.1, 0.2, 0.0], [0.7, 2.0, -3.0, 0.1]])
CLIPPED = GRAD.clamp(-0.5, 0.5)  # [[0.3, -0.1, 0.2, 0.0], [0.5, 0.5, -0.5, 0.1]]


def updated_rows(backend, optimizer, weighted):
    kernel = make_batched_embedding([TableSpec(4, 4, "t")], optimizer=optimizer, backend=backend)
    with torch.no_grad():
        for weight in kernel.table_weights:
            weight.zero_()
        kernel.sync_parameters()
    out = kernel(IDS, OFFSETS, WEIGHTS if weighted else None)
    out.backward(GRAD)
    return kernel.split_embedding_weights()[0].detach() if hasattr(kernel, "split_embedding_weights") else \
        kernel.table_weights[0].detach()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gradient_clipping_clamps_each_bags_gradient_before_ids_sum_it(backend, weighted):
    sgd = FusedOptimizerConfig("sgd", lr=1.0, gradient_clipping=True, max_gradient=0.5)
    w = WEIGHTS if weighted else torch.ones(3)
    expected = torch.zeros(4, 4)
    expected[1] = -(w[0] + w[1]) * CLIPPED[0]  # 0.3 < 0.5 per bag: not clipped, though the sum over ids is 0.6
    expected[2] = -w[2] * CLIPPED[1]
    assert torch.allclose(updated_rows(backend, sgd, weighted), expected, atol=1e-6)
    unclipped = FusedOptimizerConfig("sgd", lr=1.0)
    expected[2] = -w[2] * GRAD[1]
    assert torch.allclose(updated_rows(backend, unclipped, weighted), expected, atol=1e-6)


def test_gradient_clipping_as_fbgemms_own_tbe_on_rowwise_adagrad():
    pytest.importorskip("fbgemm_gpu")
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
                                                                         SplitTableBatchedEmbeddingBagsCodegen)

    tbe = SplitTableBatchedEmbeddingBagsCodegen([(4, 4, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=1.0,
                                                eps=1e-8, gradient_clipping=True, max_gradient=0.5,
                                                pooling_mode=PoolingMode.SUM)
    with torch.no_grad():
        tbe.split_embedding_weights()[0].zero_()
    tbe(IDS, OFFSETS).backward(GRAD)
    ours = updated_rows("torch", FusedOptimizerConfig("row_wise_adagrad", lr=1.0, eps=1e-8, gradient_clipping=True,
                                                      max_gradient=0.5), weighted=False)
    assert torch.allclose(ours, tbe.split_embedding_weights()[0], atol=1e-5)


def test_torchrecs_fused_params_keys_are_taken_or_refused_by_name():
    keys = {"optimizer": "exact_adagrad", "learning_rate": 0.05, "eps": 1e-6, "momentum": 0.9,
            "weight_decay_mode": "NONE", "gradient_clipping": True, "max_gradient": 2.0, "stochastic_rounding": True,
            "output_dtype": DataType.FP32, "enforce_hbm": True, "cache_load_factor": 0.2,
            "prefetch_pipeline": False}
    config = FusedOptimizerConfig.from_fused_params(keys)
    assert (config.optimizer.value, config.lr, config.eps, config.gradient_clipping, config.max_gradient) == \
        ("adagrad", 0.05, 1e-6, True, 2.0)
    EmbeddingBagCollectionSharder(fused_params=keys)
    EmbeddingCollectionSharder(fused_params=keys)
    with pytest.raises(ValueError, match=r"weight_decay_mode='L3' is not one of fbgemm's WeightDecayMode members"):
        FusedOptimizerConfig.from_fused_params({"optimizer": "adam", "weight_decay": 0.1, "weight_decay_mode": "L3"})
    with pytest.raises(ValueError, match=r"adagrad: weight_decay is only supported for adam"):
        FusedOptimizerConfig.from_fused_params({"optimizer": "adagrad", "weight_decay": 0.1, "weight_decay_mode": "L2"})
    with pytest.raises(ValueError, match=r"unsupported keys \['learning_rat'\]"):
        EmbeddingBagCollectionSharder(fused_params={"learning_rat": 0.1})


def tables(data_type=DataType.FP32):
    return [rtk.EmbeddingBagConfig(name=n, num_embeddings=8, embedding_dim=4, feature_names=[f"f{n}"],
                                   data_type=data_type) for n in "ab"]


def table_wise(stochastic_rounding=None):
    return {t.name: rtk.ParameterSharding("table_wise", "fused", [0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 8, 4)],
                                          stochastic_rounding=stochastic_rounding) for t in tables()}


def test_per_table_options_in_fused_params_fill_what_the_plan_leaves_none():
    filled = with_table_options(table_wise(stochastic_rounding=False),
                                {"stochastic_rounding": True, "enforce_hbm": True, "cache_load_factor": 0.3})
    assert filled["a"].stochastic_rounding is False  # the table's own ParameterSharding wins
    assert filled["a"].enforce_hbm is True and filled["a"].cache_params.load_factor == 0.3
    assert table_wise(stochastic_rounding=False)["a"].enforce_hbm is None  # the plan is not changed


def test_per_table_options_in_fused_params_are_checked_when_sharding():
    env = ShardingEnv.local()
    ebc = rtk.EmbeddingBagCollection(tables())
    sharded = EmbeddingBagCollectionSharder(fused_params={"stochastic_rounding": True, "learning_rate": 0.1}).shard(
        ebc, table_wise(), env)  # FP32 tables: nothing to round
    assert sharded.fused_optimizer is not None
    half = rtk.EmbeddingBagCollection(tables(DataType.FP16))
    with pytest.raises(NotImplementedError, match=r"table 'a'.*stochastic_rounding=True for a FP16 table"):
        EmbeddingBagCollectionSharder(fused_params={"stochastic_rounding": True}).shard(half, table_wise(), env)
    with pytest.raises(NotImplementedError, match=r"output_dtype=.*FP16.*output fp32"):
        EmbeddingBagCollectionSharder(fused_params={"output_dtype": DataType.FP16}).shard(ebc, table_wise(), env)
