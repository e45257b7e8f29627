"""DistributedModelParallel.fused_optimizer beside TorchRec 1.8's, on 2 gloo ranks: the same script runs on both.

TorchRec's is a CombinedOptimizer of each sharded module's fused optimizer, keyed by the module's path, each itself
a CombinedOptimizer of one optimizer per lookup (sharding group) keyed "": what `.optimizers`, `.params`,
`.param_groups`, `state_dict()` (with and without `save_param_groups(True)`) and `repr` show must agree, and wrapping
it in a CombinedOptimizer beside a dense KeyedOptimizerWrapper must work as in TorchRec. TorchRec 1.8 keeps lr as
float32 (0.10000000149011612 for 0.1) and its state as ShardedTensors: lrs are compared to float32 precision, states
by name. A changed lr in one group's param_group reaches that group's tables only.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from rectoolkit.distributed import full_state_dict
from torch import nn

from dist_harness import run_side_by_side, run_workers


def _model(lib) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=6 + i, embedding_dim=4, feature_names=[f"f{i}"])
        for i in range(3)], device=torch.device("cpu"))
    model.lin = nn.Linear(4, 1)
    model.ec = lib.EmbeddingCollection(tables=[
        lib.EmbeddingConfig(name=f"e{i}", num_embeddings=6 + i, embedding_dim=4, feature_names=[f"g{i}"])
        for i in range(2)], device=torch.device("cpu"))
    return model


def _libraries(lib_name: str):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if lib_name == "torchrec":
        import torchrec as lib
        from torchrec.distributed import model_parallel, sharding_plan
        from torchrec.distributed.embedding import EmbeddingCollectionSharder
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.optim import keyed
    else:
        import rectoolkit as lib
        from rectoolkit.distributed import model_parallel, sharding_plan
        from rectoolkit.distributed.embedding import EmbeddingCollectionSharder
        from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from rectoolkit.optim import keyed
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused), EmbeddingCollectionSharder(fused_params=fused)]
    return lib, model_parallel, sharding_plan, sharders, keyed


def _structure(optimizer) -> list:
    """(key, class name, params) of each sub-optimizer, nested as the CombinedOptimizers nest them."""
    if not hasattr(optimizer, "optimizers"):
        return list(optimizer.params)
    return [[key, type(sub).__name__ if hasattr(sub, "optimizers") else "leaf", _structure(sub)]
            for key, sub in optimizer.optimizers]


def surface_worker(rank: int, world_size: int, lib_name: str, out_dir: str) -> None:
    lib, mp, sp, sharders, keyed = _libraries(lib_name)
    model = _model(lib)
    fused = dict(compute_kernel="fused")
    plan = mp.ShardingPlan({
        "ebc": sp.construct_module_sharding_plan(model.ebc, {
            "t0": sp.table_wise(rank=1, **fused), "t1": sp.row_wise(**fused), "t2": sp.column_wise(ranks=[0, 1], **fused)},
            world_size=world_size, device_type="cpu", sharder=sharders[0]),
        "ec": sp.construct_module_sharding_plan(model.ec, {"e0": sp.table_wise(rank=0, **fused), "e1": sp.row_wise(**fused)},
                                                world_size=world_size, device_type="cpu", sharder=sharders[1])})
    dmp = mp.DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    optimizer = dmp.fused_optimizer
    seen = {"is_combined": isinstance(optimizer, keyed.CombinedOptimizer), "structure": _structure(optimizer),
            "params": list(optimizer.params), "state": {k: list(v) for k, v in optimizer.state_dict()["state"].items()},
            "state_dict_keys": list(optimizer.state_dict()),
            "param_groups": [[len(g["params"]), g["lr"], sorted(g)] for g in optimizer.param_groups],
            "module_params": list(dmp.module.ebc.fused_optimizer.params),
            "zero_grad": optimizer.zero_grad(), "step": optimizer.step(),
            "repr": repr(optimizer)}
    optimizer.save_param_groups(True)
    seen["saved_groups"] = [[g["params"], g["lr"]] for g in optimizer.state_dict()["param_groups"]]
    optimizer.save_param_groups(False)
    dense = keyed.KeyedOptimizerWrapper({"lin.weight": dmp.module.lin.weight},
                                        lambda params: torch.optim.SGD(params, lr=0.1))
    combined = keyed.CombinedOptimizer([("fused", optimizer), ("dense", dense)])
    seen["combined_params"] = list(combined.params)
    combined.load_state_dict(combined.state_dict())
    with open(os.path.join(out_dir, f"{lib_name}_{rank}.json"), "w") as f:
        json.dump(seen, f)


def _same_lr(ours, theirs) -> bool:
    return abs(ours - theirs) <= 1e-7 * abs(theirs)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.fbgemm
@pytest.mark.timeout(240)
def test_fused_optimizer_is_torchrecs_combined_optimizer(tmp_path):
    pytest.importorskip("torchrec")
    seen = run_side_by_side(surface_worker, str(tmp_path))
    for rank, (theirs, ours) in enumerate(seen):
        for key in ("is_combined", "structure", "params", "state", "state_dict_keys", "module_params", "zero_grad",
                    "step", "combined_params"):
            assert ours[key] == theirs[key], (rank, key)
        assert len(ours["param_groups"]) == len(theirs["param_groups"]), rank
        for (n, lr, keys), (their_n, their_lr, their_keys) in zip(ours["param_groups"], theirs["param_groups"]):
            assert (n, keys) == (their_n, their_keys) and _same_lr(lr, their_lr), rank
        assert [g[0] for g in ours["saved_groups"]] == [g[0] for g in theirs["saved_groups"]], rank
        assert ours["repr"].replace("0.1\n", "LR\n") == theirs["repr"].replace("0.10000000149011612\n", "LR\n")
    assert seen[0][1]["structure"] == [
        ["ebc", "CombinedOptimizer", [["", "leaf", ["embedding_bags.t1.weight"]],   # row-wise group first (t1 < t2)
                                      ["", "leaf", ["embedding_bags.t2.weight"]]]],  # t0 lives on rank 1
        ["ec", "CombinedOptimizer", [["", "leaf", ["embeddings.e0.weight"]], ["", "leaf", ["embeddings.e1.weight"]]]]]


def group_lr_worker(rank: int, world_size: int) -> None:
    """Fused SGD: a table moves by -lr * its gradient, so a group whose lr is set to 0 keeps its tables."""
    import rectoolkit as rtk
    from rectoolkit.distributed import model_parallel as mp
    from rectoolkit.distributed import sharding_plan as sp
    from rectoolkit.distributed.embeddingbag import EmbeddingBagCollectionSharder

    model = _model(rtk)
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "sgd", "learning_rate": 0.5})
    plan = mp.ShardingPlan({"ebc": sp.construct_module_sharding_plan(model.ebc, {
        "t0": sp.table_wise(rank=0, compute_kernel="fused"), "t1": sp.row_wise(compute_kernel="fused"),
        "t2": sp.data_parallel()},
        world_size=world_size, device_type="cpu", sharder=sharder)})
    dmp = mp.DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=[sharder])
    before = {k: v.clone() for k, v in full_state_dict(dmp).items()}
    optimizer = dmp.fused_optimizer
    groups = {tuple(key for key, p in optimizer.params.items() if any(p is q for q in g["params"])): g
              for g in optimizer.param_groups}
    # (t2's replica has the dense kernel, as TorchRec's: in no fused group, it waits for a dense optimizer)
    assert "ebc.embedding_bags.t2.weight" not in optimizer.params and len(groups) == 2 - rank  # (t0: rank 0's)
    row_wise = next(g for keys, g in groups.items() if keys == ("ebc.embedding_bags.t1.weight",))
    row_wise["lr"] = 0.0
    optimizer.step()
    kjt = rtk.KeyedJaggedTensor.from_lengths_sync(keys=["f0", "f1", "f2"], values=torch.tensor([1, 2, 3, 4, 5, 0]),
                                                 lengths=torch.tensor([1, 1, 1, 1, 1, 1]))
    dmp.module.ebc(kjt).wait().values().sum().backward()
    after = full_state_dict(dmp)
    assert torch.equal(after["ebc.embedding_bags.t1.weight"], before["ebc.embedding_bags.t1.weight"])
    assert torch.equal(after["ebc.embedding_bags.t2.weight"], before["ebc.embedding_bags.t2.weight"])
    assert dict(dmp.named_parameters())["ebc.embedding_bags.t2.weight"].grad.abs().sum() > 0
    assert not torch.equal(after["ebc.embedding_bags.t0.weight"], before["ebc.embedding_bags.t0.weight"])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_each_sharding_groups_lr_reaches_its_own_tables():
    run_workers(group_lr_worker, 2)
