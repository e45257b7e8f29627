"""TorchRec's small types at torchrec.distributed.types / .embedding_types, against TorchRec 1.8's on the same
inputs: the table and group dataclasses (fields, defaults, methods), OptimType, ListOfKJTList, InputDistOutputs,
NoOpQuantizedCommCodec, CacheStatistics and compute_storage_usage."""

from __future__ import annotations

import dataclasses
import doctest

import pytest
import torch

import rectoolkit as rtk
import rectoolkit.distributed.kjt_lists as kjt_lists_module
import rectoolkit.distributed.sharded_tables as sharded_tables_module
import rectoolkit.optim.optim_type as optim_type_module
from rectoolkit.distributed import embedding_types as ours
from rectoolkit.distributed import types as our_types

theirs = pytest.importorskip("torchrec.distributed.embedding_types")
pytestmark = pytest.mark.torchrec

import torchrec  # noqa: E402
from torchrec.distributed import types as their_types  # noqa: E402


def test_docstring_examples():
    for module in (sharded_tables_module, kjt_lists_module, optim_type_module):
        assert doctest.testmod(module).failed == 0


def _defaults(cls):
    return [(f.name, None if f.default is dataclasses.MISSING else getattr(f.default, "value", f.default))
            for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("name", ["ShardedConfig", "ShardedMetaConfig", "EmbeddingAttributes", "ShardedEmbeddingTable",
                                  "GroupedEmbeddingConfig", "DTensorMetadata", "InputDistOutputs"])
def test_dataclass_fields_and_defaults(name):
    assert _defaults(getattr(ours, name)) == _defaults(getattr(theirs, name))


def test_optim_type():
    assert [(m.name, m.value) for m in ours.OptimType] == [(m.name, m.value) for m in theirs.OptimType]


TABLES = [  # name, rows, dim, features, local rows, local cols, kernel, embedding names
    ("t0", 10, 8, ["a", "b"], 10, 4, "fused", ["a", "b"]),
    ("t1", 7, 16, ["c"], 4, 16, "dense", ["c_emb"]),
    ("t2", 3, 4, [], 3, 4, "fused", []),
    ("t3", 50, 12, ["d", "e", "f"], 25, 6, "fused_uvm_caching", ["d", "e", "f"]),
]


def _group(lib, types_module, tables, with_metadata):
    built = []
    for index, (name, rows, dim, features, local_rows, local_cols, kernel, names) in enumerate(tables):
        metadata = types_module.ShardMetadata(shard_offsets=[0, 0], shard_sizes=[local_rows, local_cols],
                                              placement=f"rank:{index}/cpu") if with_metadata else None
        built.append(types_module.ShardedEmbeddingTable(
            num_embeddings=rows, embedding_dim=dim, name=name, feature_names=list(features),
            embedding_names=list(names), local_rows=local_rows, local_cols=local_cols,
            compute_kernel=types_module.EmbeddingComputeKernel(kernel), local_metadata=metadata,
            fused_params={"learning_rate": 0.1}))
    return types_module.GroupedEmbeddingConfig(lib.DataType.FP32, lib.PoolingType.SUM, False, False,
                                               types_module.EmbeddingComputeKernel.FUSED, built)


METHODS = ["feature_hash_sizes", "num_features", "dim_sum", "table_names", "feature_names", "embedding_dims",
           "embedding_names", "is_using_virtual_table"]


@pytest.mark.parametrize("tables", [TABLES, TABLES[:1], TABLES[1:], [], TABLES[::-1]], ids=["all", "one", "tail",
                                                                                         "none", "reversed"])
@pytest.mark.parametrize("with_metadata", [False, True])
def test_grouped_embedding_config_methods(tables, with_metadata):
    mine, reference = _group(rtk, ours, tables, with_metadata), _group(torchrec, theirs, tables, with_metadata)
    for method in METHODS:
        assert getattr(mine, method)() == getattr(reference, method)(), method
    metadata = [(m.shard_offsets, m.shard_sizes, str(m.placement)) if m is not None else None
                for m in mine.embedding_shard_metadata()]
    assert metadata == [(m.shard_offsets, m.shard_sizes, str(m.placement)) if m is not None else None
                        for m in reference.embedding_shard_metadata()]
    for my_table, their_table in zip(mine.embedding_tables, reference.embedding_tables):
        assert my_table.num_features() == their_table.num_features()
        assert my_table.compute_kernel.value == their_table.compute_kernel.value


def test_sharded_embedding_table_defaults():
    mine = ours.ShardedEmbeddingTable(num_embeddings=4, embedding_dim=2)
    reference = theirs.ShardedEmbeddingTable(num_embeddings=4, embedding_dim=2)
    assert mine.compute_kernel.value == reference.compute_kernel.value
    assert (mine.local_rows, mine.local_cols, mine.local_metadata, mine.fused_params, mine.pooling.value) == \
        (reference.local_rows, reference.local_cols, reference.local_metadata, reference.fused_params,
         reference.pooling.value)


def _kjt(lib, seed):
    return lib.KeyedJaggedTensor(keys=["a"], values=torch.tensor([seed, seed + 1]), lengths=torch.tensor([2]))


def test_list_of_kjt_list():
    results = []
    for lib, module in ((rtk, ours), (torchrec, theirs)):
        lists = module.ListOfKJTList([module.KJTList([_kjt(lib, 0), _kjt(lib, 2)]), module.KJTList([_kjt(lib, 4)])])
        lists[1] = module.KJTList([_kjt(lib, 6), _kjt(lib, 8), _kjt(lib, 10)])
        results.append((len(lists), [len(kjts) for kjts in lists], lists[1][2].values().tolist(),
                        [kjt.values().tolist() for kjts in lists.features_list for kjt in kjts]))
    assert results[0] == results[1]


def test_input_dist_outputs():
    results = []
    for lib, module in ((rtk, ours), (torchrec, theirs)):
        outputs = module.InputDistOutputs(features=module.KJTList([_kjt(lib, 1)]),
                                          bucket_mapping_tensor=torch.tensor([1, 0]))
        results.append(([kjt.values().tolist() for kjt in outputs.features], outputs.unbucketize_permute_tensor,
                        outputs.bucket_mapping_tensor.tolist(), outputs.bucketized_length))
    assert results[0] == results[1]


def test_no_op_quantized_comm_codec():
    tensor = torch.randn(5)
    results = []
    for module in (our_types, their_types):
        codec = module.NoOpQuantizedCommCodec()
        results.append((codec.encode(tensor) is tensor, codec.decode(tensor, None) is tensor, codec.quantized_dtype(),
                        codec.calc_quantized_size(17), codec.create_context()))
    assert results[0] == results[1]


def test_cache_statistics_is_abstract_with_the_same_members():
    assert our_types.CacheStatistics.__abstractmethods__ == their_types.CacheStatistics.__abstractmethods__
    with pytest.raises(TypeError):
        our_types.CacheStatistics()

    class Uniform(our_types.CacheStatistics):
        expected_lookups = property(lambda self: 100.0)
        cacheability = property(lambda self: 1.0)

        def expected_miss_rate(self, clf: float) -> float:
            return 1.0 - clf

    assert Uniform().expected_miss_rate(0.25) == 0.75


@pytest.mark.parametrize("device", ["cuda", "cpu", "mtia", "tpu"])
@pytest.mark.parametrize("kernel", ["dense", "fused", "fused_uvm", "fused_uvm_caching", "quant", "quant_uvm",
                                    "quant_uvm_caching"])
@pytest.mark.parametrize("usage", ["BASE_QUANT", "BASE", "DEFAULT"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_compute_storage_usage(device, kernel, usage, dtype):
    tensor = torch.zeros(6, 10, dtype=dtype)
    mine = our_types.compute_storage_usage(tensor, device, kernel, getattr(our_types.StorageUsageType, usage))
    reference = their_types.compute_storage_usage(tensor, device, kernel, getattr(their_types.StorageUsageType, usage))
    assert mine == reference
