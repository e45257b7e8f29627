"""Small TorchRec names beside TorchRec 1.8's: get_unwrapped_module / get_module (DMP, DDP, FSDP wrappers),
torchrec.optim.fused, and the helpers of torchrec.modules.embedding_configs. The DMP checks run the same script on
2 gloo ranks for each library and compare what it saw."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "distributed"))
from dist_harness import run_workers  # noqa: E402


def _libs(lib_name: str):
    if lib_name == "torchrec":
        import torchrec as lib
        from torchrec.distributed import model_parallel, sharding_plan
        from torchrec.distributed.types import ShardingEnv, ShardingPlan
    else:
        import rectoolkit as lib
        from rectoolkit.distributed import model_parallel, sharding_plan
        from rectoolkit.distributed.types import ShardingEnv, ShardingPlan
    return lib, model_parallel, sharding_plan, ShardingEnv, ShardingPlan


def _model(lib) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=6 + i, embedding_dim=4, feature_names=[f"f{i}"])
        for i in range(2)], device=torch.device("cpu"))
    model.lin = nn.Linear(4, 1)
    return model


def _unwrap_worker(rank: int, world_size: int, lib_name: str, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    lib, mp_, sp, ShardingEnv, ShardingPlan = _libs(lib_name)
    seen = {}
    plain = nn.Linear(2, 2)
    seen["plain"] = [mp_.get_unwrapped_module(plain) is plain, mp_.get_module(plain) is plain]
    ddp = DistributedDataParallel(nn.Linear(2, 2))
    seen["ddp"] = [mp_.get_unwrapped_module(ddp) is ddp.module, mp_.get_module(ddp) is ddp]
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    for init_dp in (False, True):
        model = _model(lib)
        plan = ShardingPlan({"ebc": sp.construct_module_sharding_plan(
            model.ebc, {"t0": sp.table_wise(rank=0), "t1": sp.row_wise()}, world_size=world_size,
            device_type="cpu")})
        dmp = mp_.DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan,
                                           init_data_parallel=init_dp)
        unwrapped, got = mp_.get_unwrapped_module(dmp), mp_.get_module(dmp)
        seen[f"dmp_{init_dp}"] = {
            "unwrapped_is_module": unwrapped is dmp.module,
            "unwrapped_has_ebc": hasattr(unwrapped, "ebc"),
            "get_module_is_ddp": isinstance(got, DistributedDataParallel),
            "get_module_is_wrapped": got is dmp._dmp_wrapped_module,
            "get_module_is_module": got is dmp.module,
            "idempotent": mp_.get_unwrapped_module(unwrapped) is unwrapped,
        }
    with open(os.path.join(out_dir, f"{lib_name}_{rank}.json"), "w") as f:
        json.dump(seen, f)


@pytest.mark.timeout(300)
def test_get_unwrapped_module_and_get_module_match_torchrec(tmp_path):
    for lib_name in ("torchrec", "rectoolkit"):
        run_workers(_unwrap_worker, 2, lib_name, str(tmp_path))
    for rank in range(2):
        theirs = json.loads((tmp_path / f"torchrec_{rank}.json").read_text())
        ours = json.loads((tmp_path / f"rectoolkit_{rank}.json").read_text())
        assert ours == theirs
    assert ours["dmp_True"]["get_module_is_ddp"] and ours["dmp_True"]["unwrapped_is_module"], ours
    assert ours["dmp_False"]["get_module_is_module"] and ours["dmp_False"]["unwrapped_has_ebc"], ours


def test_get_unwrapped_module_single_process():
    from rectoolkit.distributed import model_parallel as ours
    from torchrec.distributed import model_parallel as theirs

    for mp_ in (ours, theirs):
        m = nn.Sequential(nn.Linear(2, 2))
        assert mp_.get_unwrapped_module(m) is m and mp_.get_module(m) is m


# ------------------------------------------------------------------------------------------------ optim.fused
def _fused_worker(rank: int, world_size: int, lib_name: str, out_dir: str) -> None:
    import torch.distributed as dist

    lib, mp_, sp, ShardingEnv, ShardingPlan = _libs(lib_name)
    if lib_name == "torchrec":
        from torchrec.optim.fused import FusedOptimizerModule
    else:
        from rectoolkit.optim.fused import FusedOptimizerModule
    model = _model(lib)
    plan = ShardingPlan({"ebc": sp.construct_module_sharding_plan(
        model.ebc, {"t0": sp.table_wise(rank=1, compute_kernel="fused"), "t1": sp.row_wise(compute_kernel="fused")},
        world_size=world_size, device_type="cpu")})
    dmp = mp_.DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                       device=torch.device("cpu"), plan=plan)
    opts = []  # the common loop (module paths differ: the DMP's attribute names are its own)
    for m in dmp.modules():
        if isinstance(m, FusedOptimizerModule):
            opts.append(m.fused_optimizer)
    seen = {"keys": [sorted(o.params) for o in opts], "types": [type(o).__name__ for o in opts], "dmp": isinstance(dmp, FusedOptimizerModule),
            "sharded": isinstance(dmp.module.ebc, FusedOptimizerModule),
            "dense": isinstance(dmp.module.lin, FusedOptimizerModule)}
    with open(os.path.join(out_dir, f"{lib_name}_{rank}.json"), "w") as f:
        json.dump(seen, f)


@pytest.mark.timeout(300)
def test_fused_optimizer_modules_collect_torchrecs_optimizers(tmp_path):
    for lib_name in ("torchrec", "rectoolkit"):
        run_workers(_fused_worker, 2, lib_name, str(tmp_path))
    for rank in range(2):
        theirs = json.loads((tmp_path / f"torchrec_{rank}.json").read_text())
        ours = json.loads((tmp_path / f"rectoolkit_{rank}.json").read_text())
        assert ours == theirs
    assert ours["dmp"] and ours["sharded"] and ours["keys"][0] == ["ebc.embedding_bags.t0.weight",
                                                                   "ebc.embedding_bags.t1.weight"]


def test_fused_optimizer_classes_match_torchrec():
    import abc

    from rectoolkit.optim import fused as ours
    from torchrec.optim import fused as theirs
    from rectoolkit.optim.keyed import KeyedOptimizer

    for lib in (ours, theirs):
        assert issubclass(lib.FusedOptimizer, abc.ABC) and lib.FusedOptimizer.__abstractmethods__ == {
            "step", "zero_grad"}
        assert lib.FusedOptimizerModule.__abstractmethods__ == {"fused_optimizer"}
        with pytest.raises(TypeError):
            lib.FusedOptimizer({}, {}, [])
        empty = lib.EmptyFusedOptimizer()
        assert empty.step() is None and empty.zero_grad() is None
        assert dict(empty.params) == {} and empty.state_dict() == {"state": {}} and repr(empty) == \
            "EmptyFusedOptimizer ()"
    assert issubclass(ours.FusedOptimizer, KeyedOptimizer)
    assert not isinstance(nn.Linear(1, 1), ours.FusedOptimizerModule)

    class WithOne(nn.Module, ours.FusedOptimizerModule):  # a user's module, written for TorchRec
        @property
        def fused_optimizer(self):
            return ours.EmptyFusedOptimizer()

    assert isinstance(WithOne(), ours.FusedOptimizerModule)
    import rectoolkit as rtk

    ebc = rtk.EmbeddingBagCollection([rtk.EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=2,
                                                            feature_names=["f"])], optimizer="sgd", lr=0.5)
    assert isinstance(ebc.fused_optimizer, ours.FusedOptimizer)  # TorchRec's EmbeddingFusedOptimizer is one


# ------------------------------------------------------------------------------------------------ embedding_configs
def test_embedding_configs_helpers_match_torchrec():
    pytest.importorskip("fbgemm_gpu")
    import torchrec.modules.embedding_configs as theirs

    import rectoolkit.modules.embedding_configs as ours

    assert [(m.name, m.value) for m in ours.ShardingType] == [(m.name, m.value) for m in theirs.ShardingType]
    sharding_types = [None, *[(ours.ShardingType[m.name], m) for m in theirs.ShardingType]]
    for pooling in ours.PoolingType:
        for pair in sharding_types:
            mine, their_st = pair if pair else (None, None)
            assert ours.pooling_type_to_pooling_mode(pooling, mine) is theirs.pooling_type_to_pooling_mode(
                theirs.PoolingType[pooling.name], their_st)
            assert ours.pooling_type_to_pooling_mode(pooling, sharding_type=their_st) is \
                theirs.pooling_type_to_pooling_mode(theirs.PoolingType[pooling.name], sharding_type=their_st)
    for data_type in ours.DataType:
        try:
            expected = theirs.data_type_to_sparse_type(theirs.DataType[data_type.name])
        except ValueError as e:
            with pytest.raises(ValueError, match="Invalid DataType"):
                ours.data_type_to_sparse_type(data_type)
            assert str(e)
            continue
        assert ours.data_type_to_sparse_type(data_type) is expected


def test_fbgemm_enum_helpers_refuse_without_fbgemm(monkeypatch):
    import rectoolkit.fbgemm_probe as probe
    import rectoolkit.modules.embedding_configs as ours

    monkeypatch.setattr(probe, "fbgemm_imports", lambda: False)
    with pytest.raises(ImportError, match="pooling_type_to_pooling_mode"):
        ours.pooling_type_to_pooling_mode(ours.PoolingType.SUM)
    with pytest.raises(ImportError, match="data_type_to_sparse_type"):
        ours.data_type_to_sparse_type(ours.DataType.FP32)
