"""TorchRec's distributed entry points on rectoolkit: sharders with shard() and fused_params, the awaitable and
the three step lists of a sharded module, DMP's fused-optimizer defaults and apply_optimizer_in_backward,
shard_modules (float and quantized), torchrec.fx, DMP.init_data_parallel / copy, meta-device construction.

Expected values come from the unsharded collection with plain gradients and the optimizer's rule by hand."""

import os
import socket

import pytest
import torch
import torch.distributed as dist

from rectoolkit.distributed import full_state_dict
from torch.distributed.optim import _apply_optimizer_in_backward

import rectoolkit as rtk
from rectoolkit.distributed import DistributedModelParallel, ShardingEnv
from rectoolkit.distributed.awaitable import EmbeddingBagCollectionAwaitable, LazyAwaitable
from rectoolkit.distributed.shard import shard_modules
from rectoolkit.distributed.sharders import EmbeddingBagCollectionSharder, EmbeddingCollectionSharder
from rectoolkit.fx import Tracer, symbolic_trace
from rectoolkit.optim.optimizers import in_backward_optimizer_filter


def tables():
    return [rtk.EmbeddingBagConfig(name="t0", num_embeddings=12, embedding_dim=4, feature_names=["f0"]),
            rtk.EmbeddingBagConfig(name="t1", num_embeddings=9, embedding_dim=8, feature_names=["f1"])]


def batch():
    return rtk.KeyedJaggedTensor.from_lengths_sync(
        keys=["f0", "f1"], values=torch.tensor([1, 2, 2, 11, 0, 3, 8, 8]), lengths=torch.tensor([2, 0, 2, 1, 2, 1]))


def table_wise_plan(ranks=(0, 0)):
    return {t.name: rtk.ParameterSharding("table_wise", ranks=[r],
                                          shards=[rtk.ShardMetadata.on_rank(r, 0, 0, t.num_embeddings, t.embedding_dim)])
            for t, r in zip(tables(), ranks)}


def dense_step(ebc, kjt, grad_out):
    """The unsharded collection's plain gradients of loss = sum(out * grad_out), per table."""
    reference = rtk.EmbeddingBagCollection(tables())
    reference.load_state_dict(ebc.state_dict())
    (reference(kjt).values() * grad_out).sum().backward()
    return {name: (m.weight.detach().clone(), m.weight.grad.clone()) for name, m in reference.embedding_bags.items()}


def weights(sharded):
    return {table: weight.detach() for table, _, weight, _ in sharded.local_shards()}


# ------------------------------------------------------------------------------------------------ sharder.shard
def test_sharder_shard_gives_an_awaitable_module_with_one_step_per_group():
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables())
    plan = table_wise_plan()
    plan["t1"] = rtk.ParameterSharding("row_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 9, 8)])
    sharded = EmbeddingBagCollectionSharder().shard(ebc, plan, ShardingEnv.local(), torch.device("cpu"))
    out = sharded(batch())
    assert isinstance(out, EmbeddingBagCollectionAwaitable) and isinstance(out, LazyAwaitable)
    kt = out.wait()
    assert isinstance(kt, rtk.KeyedTensor) and kt.keys() == ["f0", "f1"]
    assert torch.equal(kt.values(), ebc(batch()).values())
    assert torch.equal(out.values(), kt.values()) and torch.equal(out["f1"], kt["f1"])  # used as the result
    assert len(sharded._input_dists) == len(sharded._lookups) == len(sharded._output_dists) == 2
    assert "table_wise, tables=['t0']" in repr(sharded._input_dists[0])
    assert "row_wise, tables=['t1']" in repr(sharded._lookups[1])
    # the steps by hand give forward's blocks; they hold no parameters of their own
    received = sharded._input_dists[1](sharded._feature_batch(batch()))
    block, columns = sharded._output_dists[1](sharded._lookups[1](received), received)
    assert torch.equal(block.t(), kt.values()[:, columns])
    assert sorted(sharded.state_dict()) == ["embedding_bags.t0.weight", "embedding_bags.t1.weight"]  # TorchRec's


def test_a_plan_written_with_torchs_enumerable_sharding_spec_shards_as_written():
    """TorchRec's hand-written ParameterSharding: positional (type, kernel, ranks, sharding_spec) with torch's
    EnumerableShardingSpec of torch's ShardMetadata; t1 row-wise in two blocks of 5 and 4 rows."""
    from torch.distributed._shard.metadata import ShardMetadata as TorchShard
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec

    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables())
    spec = EnumerableShardingSpec([TorchShard([0, 0], [5, 8], "rank:0/cpu"), TorchShard([5, 0], [4, 8], "rank:0/cpu")])
    plan = {"t0": table_wise_plan()["t0"], "t1": rtk.ParameterSharding("row_wise", "fused", [0, 0], spec)}
    sharded = EmbeddingBagCollectionSharder().shard(ebc, plan, ShardingEnv.local(), torch.device("cpu"))
    assert torch.equal(sharded(batch()).wait().values(), ebc(batch()).values())
    blocks = sorted((tuple(shard.shard_offsets), tuple(w.shape)) for table, shard, w, _ in sharded.local_shards()
                    if table == "t1")
    assert blocks == [((0, 0), (5, 8)), ((5, 0), (4, 8))]


def test_sharder_fused_params_are_the_shards_optimizer():
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables())
    grad_out = torch.randn(3, 12)
    expected = dense_step(ebc, batch(), grad_out)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.02,
                                                         "eps": 0.002})
    sharded = sharder.shard(ebc, table_wise_plan(), ShardingEnv.local())
    assert sharded.fused_optimizer.param_groups[0]["lr"] == 0.02
    (sharded(batch()).wait().values() * grad_out).sum().backward()
    for table, weight in weights(sharded).items():
        before, grad = expected[table]
        state = grad.square().mean(1)  # row-wise Adagrad, one step from zero state
        torch.testing.assert_close(weight, before - 0.02 * grad / (state.sqrt() + 0.002).unsqueeze(1))
    assert dict(in_backward_optimizer_filter(sharded.named_parameters())) == {}


def test_sharder_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match=r"unsupported keys \['cache_load_fctor', 'stochastic_rounding_'\]"):
        EmbeddingBagCollectionSharder(fused_params={"learning_rate": 0.1, "cache_load_fctor": 0.2,
                                                    "stochastic_rounding_": True})
    with pytest.raises(ValueError, match=r"qcomm_codecs_registry=\.\.\.\): keys \['a'\] are not CommOp names"):
        EmbeddingBagCollectionSharder(qcomm_codecs_registry={"a": 1})
    ec = rtk.EmbeddingCollection([rtk.EmbeddingConfig(name="s", num_embeddings=4, embedding_dim=2)])
    with pytest.raises(TypeError, match="shards EmbeddingBagCollection"):
        EmbeddingBagCollectionSharder().shard(ec, {}, ShardingEnv.local())
    sequences = EmbeddingCollectionSharder().shard(
        ec, {"s": rtk.ParameterSharding("table_wise", ranks=[0], shards=[rtk.ShardMetadata.on_rank(0, 0, 0, 4, 2)])},
        ShardingEnv.local())
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(["s"], torch.tensor([1, 3, 3]), torch.tensor([1, 2]))
    assert torch.equal(sequences(kjt).wait()["s"].values(), ec(kjt)["s"].values())


@pytest.mark.parametrize("optimizer, kwargs", [(torch.optim.SGD, {"lr": 0.5}), (torch.optim.Adagrad, {"lr": 0.1, "eps": 0.01})])
def test_apply_optimizer_in_backward_is_honoured_by_the_sharder(optimizer, kwargs):
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables())
    grad_out = torch.randn(3, 12)
    expected = dense_step(ebc, batch(), grad_out)
    for param in ebc.parameters():
        _apply_optimizer_in_backward(optimizer, [param], kwargs)
    # fused_params give the base; what apply_optimizer_in_backward recorded wins key by key (TorchRec's merge)
    sharder = EmbeddingBagCollectionSharder(fused_params={"learning_rate": 3.0, "eps": 0.01})
    sharded = sharder.shard(ebc, table_wise_plan(), ShardingEnv.local())
    assert sharded.fused_optimizer.param_groups[0]["lr"] == kwargs["lr"]
    (sharded(batch()).wait().values() * grad_out).sum().backward()
    for table, weight in weights(sharded).items():
        before, grad = expected[table]
        if optimizer is torch.optim.SGD:
            torch.testing.assert_close(weight, before - 0.5 * grad)
        else:  # Adagrad from zero state: w - lr * g / (|g| + eps)
            torch.testing.assert_close(weight, before - 0.1 * grad / (grad.abs() + 0.01))


def test_different_optimizers_per_table_are_refused():
    ebc = rtk.EmbeddingBagCollection(tables())
    _apply_optimizer_in_backward(torch.optim.SGD, [ebc.embedding_bags["t0"].weight], {"lr": 0.5})
    with pytest.raises(ValueError, match="different optimizers applied in backward.*'t1': None"):
        EmbeddingBagCollectionSharder().shard(ebc, table_wise_plan(), ShardingEnv.local())
    own = rtk.EmbeddingBagCollection(tables(), optimizer="adagrad", lr=0.1)
    with pytest.raises(ValueError, match="set on the module.*fused_params asks for"):
        EmbeddingBagCollectionSharder(fused_params={"learning_rate": 0.3}).shard(own, table_wise_plan(),
                                                                                 ShardingEnv.local())
    with pytest.raises(ValueError, match=r"cannot fuse SGD with \['momentum'\]"):
        fresh = rtk.EmbeddingBagCollection(tables())
        for param in fresh.parameters():
            _apply_optimizer_in_backward(torch.optim.SGD, [param], {"lr": 0.5, "momentum": 0.9})
        EmbeddingBagCollectionSharder().shard(fresh, table_wise_plan(), ShardingEnv.local())


# ------------------------------------------------------------------------------------------------ DMP
def test_dmp_without_optimizer_settings_fuses_sgd_with_lr_001():
    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables())
    grad_out = torch.randn(3, 12)
    expected = dense_step(ebc, batch(), grad_out)
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"": table_wise_plan()}))
    assert dmp.fused_optimizer.param_groups[0]["lr"] == 0.01
    assert sorted(dmp.fused_optimizer.params) == ["embedding_bags.t0.weight", "embedding_bags.t1.weight"]
    assert dmp.dense_parameters() == []
    (dmp(batch()).wait().values() * grad_out).sum().backward()
    for table, weight in weights(dmp.module).items():
        before, grad = expected[table]
        torch.testing.assert_close(weight, before - 0.01 * grad)


def test_dmp_keeps_plain_gradients_for_dense_kernels_and_data_parallel_replicas():
    plan = table_wise_plan()
    plan["t0"] = rtk.ParameterSharding("table_wise", "dense", ranks=[0], shards=plan["t0"].shards)
    plan["t1"] = rtk.ParameterSharding("data_parallel", "dense", ranks=[0], shards=plan["t1"].shards)
    dmp = DistributedModelParallel(rtk.EmbeddingBagCollection(tables()), env=ShardingEnv.local(),
                                   plan=rtk.ShardingPlan({"": plan}))
    assert dmp.fused_optimizer.params == {} and len(dmp.dense_parameters()) == 2
    dmp(batch()).values().sum().backward()
    assert all(p.grad is not None for p in dmp.dense_parameters())


def test_dmp_honours_apply_optimizer_in_backward_and_sharder_fused_params():
    from rectoolkit.optim import apply_optimizer_in_backward  # TorchRec's spelling

    torch.manual_seed(0)
    ebc = rtk.EmbeddingBagCollection(tables())
    grad_out = torch.randn(3, 12)
    expected = dense_step(ebc, batch(), grad_out)
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.5})
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"": table_wise_plan()}))
    assert dmp.fused_optimizer.param_groups[0]["lr"] == 0.5
    (dmp(batch()).values() * grad_out).sum().backward()
    for table, weight in weights(dmp.module).items():
        before, grad = expected[table]
        torch.testing.assert_close(weight, before - 0.5 * grad)
    by_sharder = DistributedModelParallel(
        rtk.EmbeddingBagCollection(tables()), env=ShardingEnv.local(), plan=rtk.ShardingPlan({"": table_wise_plan()}),
        sharders=[EmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_adagrad", "learning_rate": 0.2})])
    assert by_sharder.module.fused_optimizer_config == rtk.FusedOptimizerConfig("adagrad", lr=0.2)


class TwoTower(torch.nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.ebc = rtk.EmbeddingBagCollection(tables(), device=device)
        self.linear = torch.nn.Linear(12, 1, device=device)

    def forward(self, kjt):
        return self.linear(self.ebc(kjt).values())  # the awaitable is used as the KeyedTensor


def test_dmp_model_returns_tensors_init_data_parallel_and_copy():
    torch.manual_seed(0)
    model = TwoTower()
    expected = model(batch())
    dmp = DistributedModelParallel(model, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"ebc": table_wise_plan()}),
                                   init_data_parallel=False)
    dmp.init_data_parallel()
    dmp.init_data_parallel()  # again: nothing
    out = dmp(batch())
    assert type(out) is torch.Tensor and torch.equal(out, expected)
    twin = dmp.copy(torch.device("cpu"))
    assert torch.equal(twin(batch()), expected)
    twin(batch()).sum().backward()  # fused SGD moves the twin's shards only
    assert not torch.equal(twin(batch()), expected) and torch.equal(dmp(batch()), expected)
    with pytest.raises(NotImplementedError, match="shards live on cpu"):
        dmp.copy(torch.device("meta"))


def test_meta_device_collections_and_kjts_then_dmp_materialises_the_shards():
    with torch.device("meta"):
        model = TwoTower()
        kjt = rtk.KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 0, 1, 1]))
    assert model.ebc.embedding_bags["t0"].weight.device.type == "meta" and kjt.values().device.type == "meta"
    assert kjt.stride() == 2 and kjt.keys() == ["f0", "f1"]
    model.linear.to_empty(device="cpu")
    dmp = DistributedModelParallel(model, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"ebc": table_wise_plan()}))
    for table, weight in weights(dmp.module.ebc).items():
        assert weight.device.type == "cpu" and bool(weight.abs().sum() > 0) and bool(torch.isfinite(weight).all())
    assert dmp(batch()).shape == (3, 1)


# ------------------------------------------------------------------------------------------------ shard_modules, fx
def test_shard_modules_float_and_quantized():
    from rectoolkit.quant import QuantEmbeddingBagCollection

    torch.manual_seed(0)
    model = TwoTower()
    expected = model(batch())
    sharded = shard_modules(model, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"ebc": table_wise_plan()}))
    assert sharded is model and type(model.ebc).__name__ == "ShardedEmbeddingBagCollection"
    assert torch.equal(model(batch()), expected)
    qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(tables()), dtype=torch.int8)
    holder = torch.nn.Sequential(qebc)
    quantized = qebc(batch()).values()
    shard_modules(holder, env=ShardingEnv.local())  # planned here
    assert type(holder[0]).__name__ == "ShardedQuantEmbeddingBagCollection"
    assert {ps.compute_kernel for ps in holder[0].module_plan.values()} == {"quant"}  # the plan says what runs
    out = holder(batch())
    assert isinstance(out, rtk.KeyedTensor) and torch.equal(out.values(), quantized)  # inference: no awaitable


def test_fx_traced_models_give_the_untraced_outputs():
    from rectoolkit.quant.sharding import shard_quant_embedding_bag_collection
    from rectoolkit.quant import QuantEmbeddingBagCollection

    torch.manual_seed(0)
    model = TwoTower()
    traced = symbolic_trace(model)
    assert torch.equal(traced(batch()), model(batch()))
    shard_modules(model, env=ShardingEnv.local(), plan=rtk.ShardingPlan({"ebc": table_wise_plan()}))
    traced_sharded = symbolic_trace(model)
    assert any(n.op == "call_module" and n.target == "ebc._run_groups" for n in traced_sharded.graph.nodes)
    assert torch.equal(traced_sharded(batch()), model(batch()))
    qebc = QuantEmbeddingBagCollection.from_float(rtk.EmbeddingBagCollection(tables()), dtype=torch.int8)
    sharded_q = shard_quant_embedding_bag_collection(qebc, table_wise_plan(), ShardingEnv.local())
    graph = Tracer(leaf_modules=["IntNBitTableBatchedEmbeddingBagsCodegen"]).trace(sharded_q)
    gm = torch.fx.GraphModule(sharded_q, graph)
    assert torch.equal(gm(batch()).values(), qebc(batch()).values())


# ------------------------------------------------------------------------------------------------ vs TorchRec 1.8
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_process_group():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _local(tensor):
    return tensor.local_shards()[0].tensor if hasattr(tensor, "local_shards") else tensor


@pytest.mark.torchrec
@pytest.mark.parametrize("setting", ["default", "apply_optimizer_in_backward", "fused_params"])
def test_dmp_fused_optimizer_settings_match_torchrec(setting, one_process_group):
    torchrec = pytest.importorskip("torchrec")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TorchRecSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel as TorchRecDMP
    from torchrec.distributed.types import ShardingEnv as TorchRecEnv

    from rectoolkit.plan.torchrec_interop import to_torchrec

    torch.manual_seed(0)
    ours = rtk.EmbeddingBagCollection(tables())
    theirs = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim, feature_names=t.feature_names)
        for t in tables()], device=torch.device("cpu"))
    fused_params = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.05, "eps": 0.01}
    if setting == "apply_optimizer_in_backward":
        for collection in (ours, theirs):
            for param in collection.parameters():
                _apply_optimizer_in_backward(torch.optim.Adagrad, [param], {"lr": 0.3, "eps": 0.01})
    plan = rtk.ShardingPlan({"": table_wise_plan()})
    our_sharders = [EmbeddingBagCollectionSharder(fused_params)] if setting == "fused_params" else None
    their_fused = None
    if setting == "fused_params":
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        their_fused = {**fused_params, "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD}
    our_dmp = DistributedModelParallel(ours, env=ShardingEnv.from_process_group(one_process_group), plan=plan,
                                       sharders=our_sharders)
    their_dmp = TorchRecDMP(theirs, env=TorchRecEnv.from_process_group(one_process_group), device=torch.device("cpu"),
                            plan=to_torchrec(plan), sharders=[TorchRecSharder(fused_params=their_fused)])
    state_names = [{key: sorted(state) for key, state in dmp.fused_optimizer.state_dict()["state"].items()}
                   for dmp in (our_dmp, their_dmp)]
    assert state_names[0] == state_names[1]  # e.g. {"embedding_bags.t0.weight": ["t0.momentum1"]}
    their_lr = their_dmp.fused_optimizer.param_groups[0]["lr"]  # fbgemm keeps it as float32
    assert our_dmp.fused_optimizer.param_groups[0]["lr"] == pytest.approx(their_lr, rel=1e-6)
    # TorchRec's DMP initializes its shards afresh (rectoolkit's copies the module's weights): give it ours
    their_state = their_dmp.state_dict()
    with torch.no_grad():
        for key, value in full_state_dict(our_dmp).items():
            _local(their_state[key]).copy_(value)  # a view of TorchRec's live table
    grad_out = torch.randn(3, 12)
    tkjt = torchrec.KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1"], values=batch().values(),
                                                        lengths=batch().lengths())
    for _ in range(2):
        (our_dmp(batch()).wait().values() * grad_out).sum().backward()
        (their_dmp(tkjt).wait().values() * grad_out).sum().backward()
    their_state = their_dmp.state_dict()
    for key, value in full_state_dict(our_dmp).items():
        torch.testing.assert_close(value, _local(their_state[key]), msg=lambda m: f"{key}: {m}")


@pytest.mark.torchrec
def test_meta_device_construction_matches_torchrec():
    torchrec = pytest.importorskip("torchrec")
    configs = [torchrec.EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                                           feature_names=t.feature_names) for t in tables()]
    with torch.device("meta"):
        theirs = torchrec.EmbeddingBagCollection(tables=configs)
        ours = rtk.EmbeddingBagCollection(tables())
        their_kjt = torchrec.KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 2, 3]),
                                               lengths=torch.tensor([1, 0, 1, 1]))
        our_kjt = rtk.KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([1, 2, 3]),
                                        lengths=torch.tensor([1, 0, 1, 1]))
    assert {k: (v.device.type, tuple(v.shape)) for k, v in ours.state_dict().items()} == \
        {k: (v.device.type, tuple(v.shape)) for k, v in theirs.state_dict().items()}
    assert (our_kjt.stride(), our_kjt.keys(), our_kjt.values().device) == \
        (their_kjt.stride(), their_kjt.keys(), their_kjt.values().device)


@pytest.mark.torchrec
def test_dmp_takes_fused_params_from_torchrecs_own_sharder():
    pytest.importorskip("torchrec")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TorchRecSharder

    dmp = DistributedModelParallel(
        rtk.EmbeddingBagCollection(tables()), env=ShardingEnv.local(), plan=rtk.ShardingPlan({"": table_wise_plan()}),
        sharders=[TorchRecSharder(fused_params={"optimizer": "exact_adagrad", "learning_rate": 0.3})])
    assert dmp.module.fused_optimizer_config == rtk.FusedOptimizerConfig("adagrad", lr=0.3)
