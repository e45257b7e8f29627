"""DistributedModelParallel's init_parameters and state_dict order beside TorchRec 1.8's, on 2 gloo ranks.

A model built on the meta device: with init_parameters=True TorchRec's DMP gives the meta parameters outside the
sharded collections memory on its device, calls reset_parameters() of each module that had one, and zeroes meta
buffers; with False it leaves them on meta, and DDP (init_data_parallel) then fails with NotImplementedError. The
shards are real either way. state_dict() keys come in sorted order (TorchRec's add_prefix_to_state_dict sorts them,
with the keys already in `destination`); named_parameters() in the collections' table order (TorchRec also lists an
empty placeholder for a table with no shard on the rank: left out of the comparison).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import pytest
import torch
from torch import nn

from dist_harness import run_side_by_side


class Filled(nn.Module):
    """A dense module whose reset_parameters() is visible: it fills its weight with 7."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(3, device=device))
        self.register_buffer("count", torch.ones(2, device=device))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(7.0)


def _model(lib, device: str) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.ebc = lib.EmbeddingBagCollection(tables=[
        lib.EmbeddingBagConfig(name=f"t{i}", num_embeddings=6 + i, embedding_dim=4, feature_names=[f"f{i}"])
        for i in range(2)], device=torch.device(device))
    model.lin = nn.Linear(4, 1, device=device)
    model.filled = Filled(device)
    model.register_buffer("step", torch.ones(2, device=device))
    model.ec = lib.EmbeddingCollection(tables=[lib.EmbeddingConfig(
        name="e0", num_embeddings=5, embedding_dim=4, feature_names=["g0"])], device=torch.device(device))
    return model


def _dmp(lib_name: str, device: str, **kwargs):
    if lib_name == "torchrec":
        import torchrec as lib
        from torchrec.distributed import model_parallel as mp
        from torchrec.distributed import sharding_plan as sp
    else:
        import rectoolkit as lib
        from rectoolkit.distributed import model_parallel as mp
        from rectoolkit.distributed import sharding_plan as sp
    model = _model(lib, device)
    plan = mp.ShardingPlan({
        "ebc": sp.construct_module_sharding_plan(model.ebc, {"t0": sp.row_wise(), "t1": sp.table_wise(rank=1)},
                                                 world_size=2, device_type="cpu"),
        "ec": sp.construct_module_sharding_plan(model.ec, {"e0": sp.table_wise(rank=0)}, world_size=2,
                                                device_type="cpu")})
    return mp.DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, **kwargs)


def _seen(dmp) -> dict:
    return {"parameters": {name: [p.device.type, list(p.shape)] for name, p in dmp.named_parameters() if p.numel()},
            "buffers": {name: [b.device.type, b.tolist() if b.device.type != "meta" else None]
                        for name, b in dmp.named_buffers()},
            "filled": dmp.module.filled.weight.tolist() if dmp.module.filled.weight.device.type != "meta" else None}


def worker(rank: int, world_size: int, lib_name: str, out_dir: str) -> None:
    seen = {"state_dict": list(_dmp(lib_name, "cpu").state_dict()),
            "into_destination": list(_dmp(lib_name, "cpu").state_dict(
                destination=OrderedDict(zzz=torch.zeros(1), aaa=torch.zeros(1))))}
    seen["named_parameters"] = [name for name, p in _dmp(lib_name, "cpu").named_parameters() if p.numel()]
    seen["init_true"] = _seen(_dmp(lib_name, "meta"))
    lazy = _dmp(lib_name, "meta", init_data_parallel=False)
    seen["init_true_lazy"] = _seen(lazy)
    kept = _dmp(lib_name, "meta", init_parameters=False, init_data_parallel=False)
    seen["init_false"] = _seen(kept)
    try:
        kept.init_data_parallel()
        seen["init_false_ddp"] = None
    except NotImplementedError:
        seen["init_false_ddp"] = "NotImplementedError"
    try:
        _dmp(lib_name, "meta", init_parameters=False)
        seen["init_false_at_once"] = None
    except NotImplementedError:
        seen["init_false_at_once"] = "NotImplementedError"
    with open(os.path.join(out_dir, f"{lib_name}_{rank}.json"), "w") as f:
        json.dump(seen, f)


@pytest.mark.multiprocess
@pytest.mark.torchrec
@pytest.mark.timeout(300)
def test_init_parameters_and_state_dict_order_match_torchrec(tmp_path):
    pytest.importorskip("torchrec")
    seen = run_side_by_side(worker, str(tmp_path))
    for rank, (theirs, ours) in enumerate(seen):
        for key in theirs:
            assert ours[key] == theirs[key], (rank, key)
    ours = seen[0][1]
    assert ours["state_dict"] == sorted(ours["state_dict"]) and ours["into_destination"][0] == "aaa"
    assert ours["init_true"]["filled"] == [7.0] * 3 and ours["init_false"]["filled"] is None
    assert ours["init_true"]["buffers"]["step"] == ["cpu", [0.0, 0.0]]  # a meta buffer becomes zeros
    assert ours["init_false"]["parameters"]["lin.weight"] == ["meta", [1, 4]]
    assert ours["init_false"]["parameters"]["ebc.embedding_bags.t0.weight"] == ["cpu", [3, 4]]  # shards are real
    assert seen[1][1]["named_parameters"][:2] == ["ebc.embedding_bags.t0.weight", "ebc.embedding_bags.t1.weight"]
