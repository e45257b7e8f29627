"""rectoolkit.distributed.utils against TorchRec 1.8's torchrec.distributed.utils on the same inputs."""

from __future__ import annotations

import copy
import dataclasses
import doctest
import logging
from collections import OrderedDict

import pytest
import torch
from torch import nn

import rectoolkit.distributed.utils as ours

theirs = pytest.importorskip("torchrec.distributed.utils")
pytestmark = pytest.mark.torchrec

import torchrec  # noqa: E402
from torchrec.distributed import types as tr_types  # noqa: E402

import rectoolkit as rtk  # noqa: E402
from rectoolkit.distributed import types as rtk_types  # noqa: E402


def both(fn_name, *args, **kwargs):
    """The result (or the exception type and message) of ours and TorchRec's fn on deep copies of the args."""
    results = []
    for module in (ours, theirs):
        call_args, call_kwargs = copy.deepcopy((args, kwargs))
        try:
            results.append(("ok", getattr(module, fn_name)(*call_args, **call_kwargs), call_args, call_kwargs))
        except Exception as error:  # the same failure on both sides is what is compared
            results.append(("error", type(error).__name__, str(error)))
    return results


def test_docstring_examples():
    assert doctest.testmod(ours).failed == 0


@pytest.mark.parametrize("prefix,name", [("a", "b"), ("", "b"), ("a", ""), ("", ""), ("a.b", "c.d")])
def test_append_prefix(prefix, name):
    assert ours.append_prefix(prefix, name) == theirs.append_prefix(prefix, name)


@pytest.mark.parametrize("value", [0, "", None, [], 3])
def test_none_throws_get_class_name_assert_instance(value):
    mine, reference = both("none_throws", value, "missing x")
    assert mine == reference
    assert ours.get_class_name(value) == theirs.get_class_name(value)
    for cls in (int, str, object):
        assert both("assert_instance", value, cls)[0][:2] == both("assert_instance", value, cls)[1][:2]
        assert both("assert_instance", value, cls)[0] == both("assert_instance", value, cls)[1]


def test_get_device_type():
    assert ours.get_device_type() == theirs.get_device_type()


STATE = OrderedDict([("a.w", 1), ("ab.w", 2), ("a.b.w", 3), ("a", 4), ("b.a.w", 5), ("a.", 6)])


@pytest.mark.parametrize("name", ["a", "ab", "b", "", "a.b"])
def test_filter_state_dict(name):
    mine, reference = ours.filter_state_dict(STATE, name), theirs.filter_state_dict(STATE, name)
    assert list(mine.items()) == list(reference.items()) and type(mine) is type(reference)


@pytest.mark.parametrize("with_metadata", [False, True])
def test_add_prefix_to_state_dict(with_metadata):
    results = []
    for module in (ours, theirs):
        state = OrderedDict([("z", 1), ("a.w", 2), ("m", 3)])
        if with_metadata:
            state["_metadata"] = OrderedDict([("", {"v": 1}), ("a", {"v": 2})])
        assert module.add_prefix_to_state_dict(state, "model.") is None
        results.append([(key, dict(value) if isinstance(value, OrderedDict) else value)
                        for key, value in state.items()])
    assert results[0] == results[1]


def _model(lib, sharded_cls):
    """dense.a, dense.b; tower.sparse (sharded) + tower.proj; tower2.inner.sparse (sharded) + tower2.inner.x;
    top."""
    sharded = type("Sharded", (sharded_cls,), {"forward": lambda self, x: x})
    model = nn.Module()
    model.dense = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model.tower = nn.Module()
    model.tower.sparse = sharded()
    model.tower.proj = nn.Linear(2, 2)
    model.tower2 = nn.Module()
    model.tower2.inner = nn.Module()
    model.tower2.inner.sparse = sharded()
    model.tower2.inner.x = nn.Linear(2, 1)
    model.tower2.y = nn.Linear(2, 1)
    model.top = nn.Linear(2, 1)
    return model


def test_get_unsharded_module_names():
    mine = ours.get_unsharded_module_names(_model(rtk, rtk_types.ShardedModule))
    reference = theirs.get_unsharded_module_names(_model(torchrec, _torchrec_sharded_base()))
    assert sorted(mine) == sorted(reference) and len(mine) == len(reference)
    unsharded_only = nn.Sequential(nn.Linear(1, 1))
    assert ours.get_unsharded_module_names(unsharded_only) == theirs.get_unsharded_module_names(unsharded_only)


def _torchrec_sharded_base():
    """A concrete subclass of TorchRec's abstract ShardedModule (its abstract methods stubbed)."""
    abstract = {name: (lambda self, *a, **k: None) for name in tr_types.ShardedModule.__abstractmethods__}
    return type("TorchRecSharded", (tr_types.ShardedModule,), abstract)


@pytest.mark.parametrize("fused,per_table", [
    (None, None), ({"learning_rate": 0.1, "optimizer": "sgd"}, None), (None, {"lr": 0.5}),
    ({"learning_rate": 0.1, "eps": 1e-3, "nested": [1]}, {"lr": 0.5, "eps": 1e-4}), ({}, {"learning_rate": 2.0})])
def test_merge_fused_params(fused, per_table):
    mine, reference = both("merge_fused_params", fused, per_table)
    assert mine == reference


def _sharding(types_module, kind, **kwargs):
    sharding_type, kernel = kind
    return types_module.ParameterSharding(sharding_type, kernel, [0], None, **kwargs)


@pytest.mark.parametrize("kind", [("table_wise", "fused"), ("data_parallel", "dense"), ("row_wise", "dense"),
                                  ("row_wise", "fused_uvm_caching")])
@pytest.mark.parametrize("options", [
    {}, {"enforce_hbm": True, "stochastic_rounding": False}, {"output_dtype": "FP16"},
    {"cache_params": {"load_factor": 0.2, "precision": "FP16", "prefetch_pipeline": True}},
    {"cache_params": {"reserved_memory": 1.5}, "bounds_check_mode": "WARNING"}])
def test_add_params_from_parameter_sharding(kind, options, caplog):
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

    outputs = []
    for module, types_module in ((ours, rtk_types), (theirs, tr_types)):
        kwargs = dict(options)
        if "cache_params" in kwargs:
            cache = dict(kwargs["cache_params"])
            if "precision" in cache:
                cache["precision"] = getattr(types_module.DataType, cache["precision"])
            kwargs["cache_params"] = types_module.CacheParams(**cache)
        if "output_dtype" in kwargs:
            kwargs["output_dtype"] = getattr(types_module.DataType, kwargs["output_dtype"])
        if "bounds_check_mode" in kwargs:
            kwargs["bounds_check_mode"] = getattr(BoundsCheckMode, kwargs["bounds_check_mode"])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            fused = {"learning_rate": 0.1, "enforce_hbm": False}
            result = module.add_params_from_parameter_sharding(fused, _sharding(types_module, kind, **kwargs))
        assert result is fused
        outputs.append(({key: getattr(value, "value", value) for key, value in result.items()},
                        [record.getMessage() for record in caplog.records]))
    assert outputs[0] == outputs[1]
    assert ours.add_params_from_parameter_sharding(None, _sharding(rtk_types, kind)) == \
        theirs.add_params_from_parameter_sharding(None, _sharding(tr_types, kind))


@pytest.mark.parametrize("key", ["cache_precision", "weights_precision", "output_dtype", "other"])
@pytest.mark.parametrize("data_type", ["FP32", "FP16", "BF16", "INT8", "UINT8", "INT4", "INT2"])
def test_convert_to_fbgemm_types(key, data_type):
    mine = ours.convert_to_fbgemm_types({key: getattr(rtk.DataType, data_type), "lr": 1})
    reference = theirs.convert_to_fbgemm_types({key: getattr(torchrec.DataType, data_type), "lr": 1})
    if key == "other":  # a key it does not convert keeps each library's own DataType
        assert mine[key].value == reference[key].value
    else:
        assert mine == reference
    passed = {"cache_precision": "already", "output_dtype": None}
    assert ours.convert_to_fbgemm_types(passed) is passed and passed == theirs.convert_to_fbgemm_types(
        {"cache_precision": "already", "output_dtype": None})


TORCH_OPTIMIZERS = [torch.optim.SGD, torch.optim.Adagrad, torch.optim.Adam, torch.optim.RMSprop]
LIBRARY_OPTIMIZERS = ["SGD", "LarsSGD", "LAMB", "PartialRowWiseLAMB", "Adam", "PartialRowWiseAdam", "Adagrad",
                      "RowWiseAdagrad"]


@pytest.mark.parametrize("optimizer", TORCH_OPTIMIZERS + LIBRARY_OPTIMIZERS)
def test_optimizer_type_to_emb_opt_type(optimizer):
    if isinstance(optimizer, str):
        mine = both("optimizer_type_to_emb_opt_type", getattr(rtk.optim, optimizer))[0]
        reference = both("optimizer_type_to_emb_opt_type", getattr(torchrec.optim, optimizer))[1]
    else:
        mine, reference = both("optimizer_type_to_emb_opt_type", optimizer)
    assert mine[:2] == reference[:2]
    if mine[0] == "error":
        assert mine[2].startswith(reference[2])  # ours adds the classes it takes


def test_emb_opt_type_to_optimizer_class():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    for member in list(EmbOptimType) + [None]:
        mine, reference = ours.emb_opt_type_to_optimizer_class(member), theirs.emb_opt_type_to_optimizer_class(member)
        assert getattr(mine, "__name__", None) == getattr(reference, "__name__", None)


class _Net(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.a = nn.Linear(3, 2, device=device)
        self.b = nn.Sequential(nn.Linear(2, 2, device=device), nn.BatchNorm1d(2, device=device))
        self.register_buffer("steps", torch.zeros(2, device=device))


@pytest.mark.parametrize("start", ["meta", "cpu"])
def test_init_parameters(start):
    shapes = []
    for module in (ours, theirs):
        torch.manual_seed(0)
        net = _Net(start)
        if start == "cpu":
            with torch.no_grad():
                for param in net.parameters():
                    param.fill_(7.0)
        torch.manual_seed(1)
        module.init_parameters(net, torch.device("cpu"))
        shapes.append({name: (tensor.device.type, tensor.clone()) for name, tensor in net.state_dict().items()})
    assert shapes[0].keys() == shapes[1].keys()
    for name in shapes[0]:
        assert shapes[0][name][0] == shapes[1][name][0]
        if start == "cpu":  # on the target device already: left as it is (both still 7.0)
            torch.testing.assert_close(shapes[0][name][1], shapes[1][name][1])
        else:  # materialised on cpu and reset (same seed, same reset order)
            if name != "steps":  # a buffer to_empty leaves uninitialised
                torch.testing.assert_close(shapes[0][name][1], shapes[1][name][1])


@pytest.fixture
def nccl_stand_in(monkeypatch):
    """TorchRec's sharded_model_copy patches ProcessGroupNCCL, which a torch built without NCCL lacks (its
    __enter__ then fails half-way, leaving torch.Tensor.__deepcopy__ patched); give it a class to patch."""
    c10d = torch._C._distributed_c10d
    if not hasattr(c10d, "ProcessGroupNCCL"):
        monkeypatch.setattr(c10d, "ProcessGroupNCCL", type("ProcessGroupNCCL", (), {}), raising=False)


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu")])
def test_sharded_model_copy(device, nccl_stand_in):
    copies = []
    for module in (ours, theirs):
        net = _Net("cpu")
        with module.sharded_model_copy(device):
            net_copy = copy.deepcopy(net)
        shares = [copied.data_ptr() == original.data_ptr()
                  for copied, original in zip(net_copy.state_dict().values(), net.state_dict().values())]
        copies.append((shares, [type(p).__name__ for p in net_copy.parameters()],
                       [p.requires_grad for p in net_copy.parameters()]))
        fresh = copy.deepcopy(torch.ones(2))  # patches undone: a plain deepcopy copies again
        assert fresh.data_ptr() != torch.ones(2).data_ptr()
    assert copies[0] == copies[1]


def test_copy_to_device_keeps_values_and_tensors_on_other_devices(nccl_stand_in):
    results = []
    for module in (ours, theirs):
        torch.manual_seed(0)
        net = _Net("cpu")
        net.m = nn.Linear(1, 1, device="meta")
        copied = module.copy_to_device(net, torch.device("cpu"), torch.device("cpu"))
        results.append({name: (tensor.device.type, None if tensor.is_meta else tensor.tolist())
                        for name, tensor in copied.state_dict().items()})
        assert copied is not net
    assert results[0] == results[1]


def test_sharded_model_copy_without_nccl_stand_in():
    """Ours patches only the process-group classes this torch has (TorchRec's needs ProcessGroupNCCL)."""
    net = _Net("cpu")
    with ours.sharded_model_copy(None):
        shared = copy.deepcopy(net)
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(shared.state_dict().values(), net.state_dict().values()))
    assert copy.deepcopy(net).a.weight.data_ptr() != net.a.weight.data_ptr()



def test_a_sharded_collection_copied_trains_and_reports_its_own_tables():
    """rectoolkit's collections hold their tables as views of one flat buffer: the copy's views must stay views of
    the copy's buffer (TorchRec's per-tensor copy would split them: the copy's parameters and state_dict would
    stop being what it looks up and trains), and nothing of the copy may be the original's."""
    import rectoolkit as rtk
    from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
    from rectoolkit.plan.types import ParameterSharding, ShardingPlan, ShardMetadata

    tables = [rtk.EmbeddingBagConfig(name=f"t{i}", num_embeddings=10, embedding_dim=4, feature_names=[f"f{i}"])
              for i in range(2)]
    plan = ShardingPlan({"": {t.name: ParameterSharding("table_wise", "fused", ranks=[0],
                                                        shards=[ShardMetadata.on_rank(0, 0, 0, 10, 4)])
                              for t in tables}})
    torch.manual_seed(0)
    dmp = DistributedModelParallel(rtk.EmbeddingBagCollection(tables, optimizer="sgd", lr=0.1),
                                   env=ShardingEnv.local(), plan=plan, init_data_parallel=False)
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1, 0]))
    with ours.sharded_model_copy(torch.device("cpu")):
        twin = copy.deepcopy(dmp)
    original = {k: v.clone() for k, v in dmp.state_dict().items()}
    assert all(torch.equal(twin.state_dict()[k], v) for k, v in original.items())
    # training the copy moves the copy's state_dict as it moves its lookups, and leaves the original alone
    twin(kjt).values().sum().backward()
    moved = twin.state_dict()["embedding_bags.t0.weight"]
    assert not torch.equal(moved, original["embedding_bags.t0.weight"])
    torch.testing.assert_close(moved[1], original["embedding_bags.t0.weight"][1] - 0.1)  # SGD on id 1, gradient 1
    assert all(torch.equal(dmp.state_dict()[k], v) for k, v in original.items())
    # writing the copy's parameter changes what the copy looks up
    before = twin(kjt).values().detach()
    with torch.no_grad():
        dict(twin.named_parameters())["embedding_bags.t1.weight"].add_(1.0)
    torch.testing.assert_close(twin(kjt).values().detach()[:, 4:], before[:, 4:] + torch.tensor([[1.0], [0.0]]))
    # views of one storage elsewhere stay views of one storage
    base = torch.arange(6.0)
    with ours.sharded_model_copy(torch.device("cpu")):
        whole, part = copy.deepcopy((base, base[2:4]))
    part.add_(10.0)
    assert whole.tolist() == [0.0, 1.0, 12.0, 13.0, 4.0, 5.0] and base.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def _shards(types_module, blocks):
    """ShardMetadata of (row offset, col offset, rows, cols, rank) blocks."""
    return [types_module.ShardMetadata(shard_offsets=[r, c], shard_sizes=[rows, cols], placement=f"rank:{rank}/cpu")
            for r, c, rows, cols, rank in blocks]


SHARDINGS = {  # sharding type -> shard blocks of a 12 x 8 table (grid: 2 ranks a host, 2 column blocks)
    "table_wise": [(0, 0, 12, 8, 1)],
    "column_wise": [(0, 0, 12, 4, 0), (0, 4, 12, 2, 1), (0, 6, 12, 2, 0)],
    "row_wise": [(0, 0, 5, 8, 0), (5, 0, 7, 8, 1)],
    "table_row_wise": [(0, 0, 6, 8, 2), (6, 0, 6, 8, 3)],
    "grid_shard": [(0, 0, 6, 4, 0), (6, 0, 6, 4, 1), (0, 4, 6, 4, 2), (6, 4, 6, 4, 3)],
    "data_parallel": [(0, 0, 12, 8, 0)],
    "table_column_wise": [(0, 0, 12, 4, 0), (0, 4, 12, 4, 1)],
}


@pytest.mark.parametrize("sharding_type", sorted(SHARDINGS))
@pytest.mark.parametrize("devices_per_node", [2, 4, None])
def test_create_global_tensor_shape_stride_from_metadata(sharding_type, devices_per_node):
    results = []
    for module, types_module in ((ours, rtk_types), (theirs, tr_types)):
        kernel = "dense" if sharding_type == "data_parallel" else "fused"  # (a replica's only kernel)
        sharding = types_module.ParameterSharding(sharding_type, kernel, [0], types_module.EnumerableShardingSpec(
            _shards(types_module, SHARDINGS[sharding_type])))
        try:
            results.append(module.create_global_tensor_shape_stride_from_metadata(sharding, devices_per_node))
        except (AssertionError, ValueError) as error:  # grid without devices_per_node: both refuse
            results.append(type(error).__name__)
    if sharding_type == "grid_shard" and devices_per_node is None:
        assert results == ["ValueError", "AssertionError"]
    else:
        assert results[0] == results[1]


def test_copyable_mixin(nccl_stand_in):
    copies = []
    for module in (ours, theirs):
        class Net(module.CopyableMixin):
            def __init__(self):
                super().__init__()
                self.linear = nn.Linear(2, 2)

        torch.manual_seed(0)
        net = Net()
        copied = net.copy(torch.device("cpu"))
        assert copied is not net and copied.linear is not net.linear
        # CPU to CPU: the tensors are shared with the original (copy_to_device moves, and there is no move), in both
        copies.append(({name: tensor.tolist() for name, tensor in copied.state_dict().items()},
                       copied.linear.weight.data_ptr() == net.linear.weight.data_ptr()))
    assert copies[0] == copies[1]


@pytest.mark.parametrize("blocks,num_buckets", [
    ([(0, 0, 4, 8, 0), (4, 0, 8, 8, 1)], 3), ([(0, 0, 4, 8, 0), (4, 0, 8, 8, 1)], 6),
    ([(0, 0, 12, 8, 0)], 1), ([(0, 0, 6, 8, 0), (6, 0, 0, 8, 1), (6, 0, 6, 8, 2)], 4),
    ([(0, 0, 4, 8, 0), (4, 0, 8, 8, 1)], 5),  # 12 rows do not divide into 5
    ([(0, 0, 5, 8, 0), (5, 0, 7, 8, 1)], 4),  # a shard of 5 rows: not whole buckets of 3
    ([(0, 0, 12, 4, 0), (0, 4, 12, 4, 1)], 2),  # column blocks
    ([], 2)])
def test_get_bucket_metadata_from_shard_metadata(blocks, num_buckets):
    results = []
    for module, types_module in ((ours, rtk_types), (theirs, tr_types)):
        try:
            metadata = module.get_bucket_metadata_from_shard_metadata(_shards(types_module, blocks), num_buckets)
            assert isinstance(metadata, types_module.ShardingBucketMetadata)
            results.append(dataclasses.asdict(metadata))
        except (AssertionError, ValueError) as error:  # ours: ValueError; TorchRec's: AssertionError
            results.append(type(error).__name__)
    assert results[0] == results[1] or results == ["ValueError", "AssertionError"]
    if results[0] == "ValueError":
        with pytest.raises(ValueError, match="get_bucket_metadata_from_shard_metadata: .*(shard|num_buckets|rows)"):
            ours.get_bucket_metadata_from_shard_metadata(_shards(rtk_types, blocks), num_buckets)
